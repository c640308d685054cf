"""The ``http`` sink: batches of records POSTed as JSON lists to ``url`` through the
shared two-phase machinery (:mod:`agiledart.runtime.twophase`); see the package's
theory of operation."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import aiohttp

from agiledart.app.errors import ExecutionError
from agiledart.app.spec import SinkSpec
from agiledart.operators import Record
from agiledart.runtime.connectors import json_line
from agiledart.runtime.spool import FINAL_EPOCH, Entry
from agiledart.runtime.twophase import (
    DEFAULT_BUFFER_MB,
    DestinationDown,
    DestinationRefused,
    SpooledSink,
)

if TYPE_CHECKING:
    from agiledart.runtime.confine import DataPolicy

__all__ = [
    "DEFAULT_BATCH_RECORDS",
    "DEFAULT_BUFFER_MB",
    "EndpointDown",
    "EndpointRefused",
    "HttpSink",
    "idempotency_key",
    "token_of",
]

#: the store-and-forward buffer of a sink that sets no ``buffer_mb``
#: records in one POST, at most, when the spec sets no ``batch_records``
DEFAULT_BATCH_RECORDS = 500
#: statuses worth trying again (the endpoint is busy or timed out), beside 5xx
RETRIED_4XX = frozenset({408, 425, 429})


class EndpointDown(DestinationDown):
    """The endpoint cannot take the batch now (no connection, a timeout, 5xx, 429)."""


class EndpointRefused(DestinationRefused):
    """The endpoint refused the batch with a 4xx status: sending it again cannot help."""


def token_of(env: str, *, param: str = "token_env") -> str:
    """The bearer token in the peer's environment variable ``env``."""
    value = os.environ.get(env)
    if value is None:
        msg = f"{param} names {env!r}, which is not set in this peer's environment"
        raise ExecutionError(msg)
    return value


def idempotency_key(app: str, sink: str, instance: str, epoch: int | str, batch: int) -> str:
    """A batch's ``Idempotency-Key``: the same for the same batch of the same epoch,
    however often it is sent, and from whichever peer (``instance`` is the peer the
    spec names, not the one the sink moved to; ``final``: the records after the last
    checkpoint)."""
    tag = "final" if epoch == FINAL_EPOCH else str(epoch)
    return f"{app}/{sink}/{instance}/{tag}/{batch}"


def _plain(record: Record) -> Any:
    """A record as JSON takes it: bytes hex, NaN and infinities null, numpy as Python."""
    return json.loads(json_line(record))


class HttpSink(SpooledSink):
    """Records POSTed to an endpoint: per epoch, after its checkpoint commits
    (``checkpointed``), else in batches; through a spool on disk while the endpoint
    is down or answers 5xx."""

    destination: ClassVar[str] = "the endpoint"
    unit: ClassVar[str] = "records"
    path: Path | None = None

    def _configure(
        self, spec: SinkSpec, owner: str, out_dir: Path, policy: DataPolicy | None
    ) -> None:
        p = spec.params
        self.url = str(p["url"])
        self.home = spec.peer  #: in the keys: a sink that moved sends the same ones
        headers = {str(k): str(v) for k, v in dict(p.get("headers", {})).items()}
        env = p.get("token_env")
        if env is not None:
            if policy is not None:
                policy.check_env(owner, str(env), param="token_env")
            headers["Authorization"] = f"Bearer {token_of(str(env))}"
        self.headers = headers
        self.batch_records = int(p.get("batch_records", DEFAULT_BATCH_RECORDS))
        self.timeout_s = int(p.get("timeout_ms", 10_000)) / 1000.0
        #: there once the endpoint took the whole output (a later replay sends nothing)
        self._marker = out_dir / f".{spec.id}.complete"
        #: batches without checkpoints: keys unique to this opening (at-least-once)
        self._run = secrets.token_hex(4)
        self._session: aiohttp.ClientSession | None = None

    def _rows_of(self, records: list[Record]) -> list[Any]:
        return [_plain(r) for r in records]

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            self._session = session
            try:
                await super().run()
            finally:
                self._session = None

    async def _already_complete(self) -> bool:
        return await asyncio.to_thread(self._marker.exists)

    async def _deliver(self, entries: list[Entry], final: bool) -> int:
        """The entries' records POSTed, ``batch_records`` at a time, epoch by epoch;
        a batch's number counts from its epoch's first record, so an epoch sent again
        (after the peer's restart) is cut into the same batches with the same keys."""
        loaded = await asyncio.to_thread(lambda: [(e, self.spool.load(e)) for e in entries])
        sent = 0
        for epoch, grouped in groupby(loaded, key=lambda eb: eb[1].epoch):
            group = list(grouped)
            # without checkpoints (or not sealed at the end): keyed by its place
            tag = f"{self._run}-{group[0][0].seq}" if epoch is None else epoch
            records = [r for _, b in group for r in b.rows]
            for n, i in enumerate(range(0, len(records), self.batch_records)):
                key = idempotency_key(self.app_id, self.id, self.home, tag, n)
                await self._post(records[i : i + self.batch_records], key)
            sent += len(records)
        if final:
            await asyncio.to_thread(self._marker.touch)
        await asyncio.to_thread(self.spool.remove, entries)
        return sent

    async def _post(self, records: list[Any], key: str) -> None:
        """One batch to the endpoint: a 2xx takes it; else the typed error."""
        session = self._session
        if session is None:
            msg = f"sink {self.id!r} is not running"
            raise EndpointDown(msg)
        headers = {**self.headers, "Idempotency-Key": key}
        try:
            async with session.post(self.url, json=records, headers=headers) as resp:
                if 200 <= resp.status < 300:
                    return
                body = (await resp.text(errors="replace"))[:200]
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            msg = f"POST {self.url}: {type(e).__name__}: {e}"
            raise EndpointDown(msg) from e
        what = f"HTTP {resp.status} {resp.reason or ''}".rstrip() + (f": {body}" if body else "")
        if resp.status >= 500 or resp.status in RETRIED_4XX:
            raise EndpointDown(what)
        raise EndpointRefused(what)
