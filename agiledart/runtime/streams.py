"""The data plane's frames as they come in (:mod:`agiledart.dataplane.frames`): data,
watermarks and barriers to the app instances here, credits to their outgoing edges.
A frame that breaks the protocol is counted and dropped, and closes its connection;
frames of an app not running here, or of an older generation, are dropped and counted.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from agiledart.dataplane import ProtocolError
from agiledart.dataplane.frames import BarrierFrame, CreditFrame, DataFrame, WatermarkFrame
from agiledart.overlay.errors import MalformedError, OverlayError
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.edges import Origin, ReplyChannel
from agiledart.runtime.links import Address

if TYPE_CHECKING:
    from agiledart.runtime.service import AppRuntime

__all__ = ["DataStreams"]


class DataStreams:
    """The stream handlers of one peer's runtime for the data plane."""

    def __init__(self, rt: AppRuntime) -> None:
        self.rt = rt

    async def relayed(self, kind: str, body: dict[str, Any], origin: str, at: Address) -> None:
        """A packet the relay layer carried here, in its flow's order."""
        line = Origin(origin, at, self.rt.links)
        if kind == "data":
            await self.on_data(body, line)
        elif kind == "bar":
            await self.on_barrier(body, line)
        else:
            await self.on_wm(body, line)

    async def on_data(self, msg: dict[str, Any], conn: ReplyChannel) -> None:
        with self.frame_errors():
            frame = DataFrame.from_wire(msg)
            inst = self.rt.instances.get(frame.app_id)
            if inst is None:
                self.rt.dropped["data_unknown_app"] += 1
                # the sender would wait for a credit for ever: tell it this peer does not
                # run the app (it restarted since deployment, or the app ended here)
                gone = CreditFrame(frame.app_id, frame.batch.edge, 0, frame.generation, True)
                with contextlib.suppress(OverlayError):
                    await conn.send(gone.TYPE, gone.to_wire())
                return
            if frame.generation != inst.generation:  # sent before a recovery
                self.rt.dropped["data_stale"] += 1
                return
            inst.accept_data(frame.producer, frame.batch, conn)

    async def on_wm(self, msg: dict[str, Any], conn: ReplyChannel) -> None:
        with self.frame_errors():
            frame = WatermarkFrame.from_wire(msg)
        inst = self.rt.instances.get(frame.app_id)
        if inst is not None and frame.generation == inst.generation:
            await inst.accept_wm(frame.producer, frame.watermark, frame.wall, conn.peer_name)

    async def on_barrier(self, msg: dict[str, Any], conn: ReplyChannel) -> None:
        with self.frame_errors():
            frame = BarrierFrame.from_wire(msg)
        inst = self.rt.instances.get(frame.app_id)
        if inst is not None and frame.generation == inst.generation:
            await inst.accept_barrier(frame.producer, frame.epoch, conn.peer_name)

    @contextlib.contextmanager
    def frame_errors(self) -> Iterator[None]:
        """A frame that broke the data plane's protocol is counted and dropped, and
        closes the connection it came on (the frame server's answer to a malformed
        frame); the peer and its apps live on."""
        try:
            yield
        except ProtocolError as exc:
            self.rt.dropped["malformed_frames"] += 1
            raise MalformedError(str(exc)) from None

    async def on_credit(self, msg: dict[str, Any], conn: ConnectionInfo) -> None:
        with self.frame_errors():
            frame = CreditFrame.from_wire(msg)
            inst = self.rt.instances.get(frame.app_id)
            if inst is not None and frame.generation != inst.generation:
                self.rt.dropped["data_stale"] += 1
            elif inst is None or not inst.grant(
                f"{frame.edge}>{conn.peer_name}", frame.credits, gone=frame.gone
            ):
                self.rt.dropped["credit_unknown_edge"] += 1
