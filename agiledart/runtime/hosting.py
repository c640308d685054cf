"""The app instances a peer hosts: deployed, started and undeployed at the scheduler's
word, their statistics, and what they report back to the app's scheduler (a sink's
end, a failure, checkpoint reports, scaling requests), until a scheduler takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

from agiledart.app.errors import ExecutionError
from agiledart.app.parse import parse_spec
from agiledart.errors import AgiledartError
from agiledart.overlay.errors import MalformedError
from agiledart.overlay.tcp import ConnectionInfo
from agiledart.runtime.appstate import AppRecord
from agiledart.runtime.code import code_ids_in
from agiledart.runtime.deployment import Deployment
from agiledart.runtime.errors import UnknownApp
from agiledart.runtime.instance import AppInstance
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key
from agiledart.runtime.recovery import Holder

if TYPE_CHECKING:
    from agiledart.runtime.service import AppRuntime

log = logging.getLogger(__name__)

__all__ = ["Hosting", "app_id_of", "generation_of"]

REPORT_FOR_S = 180.0  #: seconds a sink's end or a failure is reported for until taken
REPORT_TIMEOUT_S = 30.0  #: a report's wait for the scheduler's answer before it is sent again


class Hosting:
    """The app instances of one peer's runtime (``rt.instances``) and their reports."""

    def __init__(self, rt: AppRuntime) -> None:
        self.rt = rt
        self.report_timeout_s = REPORT_TIMEOUT_S  #: the peer's --report-timeout-s

    async def deploy(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        d = Deployment.from_wire(req, parse_spec)
        if d.app_id in self.rt.instances:
            return {"deployed": False}
        await self.rt.code.fetch(code_ids_in(o.fn for o in d.spec.operators))
        if d.app_id in self.rt.instances:  # deployed by a concurrent request meanwhile
            return {"deployed": False}
        if self.rt._group is None:
            msg = "this peer is not running"
            raise ExecutionError(msg)
        try:
            inst = AppInstance(
                d,
                me=self.rt.name,
                links=self.rt.links,
                resolve=self.rt.code.resolver(),
                state_dir=self.rt.state_dir,
                options=self.rt.options,
                on_sink_done=lambda sink, info: self.report_done(d, sink, info),
                on_failed=lambda error, lost: self.report_failed(d, error, lost),
                brokers=self.rt.brokers,
                engine=self.rt.engine,
                relay=self.rt.relay,
                trace=self.rt.trace if self.rt.trace.enabled else None,
                on_checkpoint=lambda report: self.report_checkpoint(d, report),
                holders=self.holders,
                uplink=self.rt.uplink,
                on_scaling=lambda body: self.ask_scaling(d, body),
                data=self.rt.data,
            )
        except AgiledartError:
            raise
        except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code (a factory) too
            log.warning("cannot build app %s here", d.app_id, exc_info=True)
            msg = f"app {d.app_id} cannot run on {self.rt.name}: {type(exc).__name__}: {exc}"
            raise ExecutionError(msg) from exc
        inst.start(self.rt._group)
        self.rt.instances[d.app_id] = inst
        if d.restore is not None:
            self.rt.restored += 1
        self.manifest_changed()
        try:
            await inst.wait_ready()  # "deployed" means ready: workers up, code loaded
        except ExecutionError:
            self.rt.instances.pop(d.app_id, None)
            await inst.aclose()
            raise
        return {"deployed": True, "operators": inst.local_ops}

    async def start(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        self.instance(req).start_sources()
        return {"started": True}

    async def undeploy(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        """Stop this peer's instance of the app. With ``generation``, only an instance of
        that generation or older: a newer one was deployed by whoever recovered the app
        since the requester last looked (its adopter, while it was frozen or cut off),
        and is not the requester's to stop; the answer names its generation and the
        scheduler it reports to."""
        app_id, fence = app_id_of(req), req.get("generation")
        held = self.rt.instances.get(app_id)
        if held is not None and type(fence) is int and held.generation > fence:
            return {
                "undeployed": False,
                "generation": held.generation,
                "scheduler": list(self.scheduler_of(held.deployment)),
            }
        inst = self.rt.instances.pop(app_id, None)
        self.rt.rebound.pop(app_id, None)
        if inst is not None:
            self.manifest_changed()
            await inst.aclose()
            if self.rt.relay is not None:
                self.rt.relay.forget(inst.app_id)
        return {"undeployed": inst is not None}

    async def app_stats(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any] | None:
        return await self.stats_of(app_id_of(req))

    async def stats_of(self, app_id: str) -> dict[str, Any] | None:
        inst = self.rt.instances.get(app_id)
        return None if inst is None else inst.statistics()

    async def report_done(self, d: Deployment, sink: str, info: dict[str, Any]) -> None:
        body = {"app_id": d.app_id, "sink": sink, "info": info, "generation": d.generation}
        if self.rt._group is not None:
            self.rt._background(self.report_until_taken(d, "app_sink_done", body))

    async def report_failed(self, d: Deployment, error: str, lost: str | None) -> None:
        body = {"app_id": d.app_id, "error": error, "lost": lost, "generation": d.generation}
        if self.rt._group is not None:
            self.rt._background(self.report_until_taken(d, "app_failed", body))

    async def report_until_taken(self, d: Deployment, type: str, body: dict[str, Any]) -> None:
        """Report a sink's end or an instance's failure until a scheduler takes it:
        the app's scheduler may be dead (its adopter rebinds the app here meanwhile)
        or restarted and not yet scheduling its apps again; a report lost here would
        leave the app running forever. Given up after :data:`REPORT_FOR_S`, or once
        the instance is undeployed or redeployed (the report is moot then)."""
        deadline = asyncio.get_running_loop().time() + REPORT_FOR_S
        wait = 0.5
        while True:
            to = self.scheduler_of(d)
            try:
                timeout = self.report_timeout_s
                if await self.rt.links.request(to, type, body, timeout=timeout) is not False:
                    return
                problem = "it does not schedule the app (yet)"
            except AgiledartError as exc:
                problem = str(exc)
            inst = self.rt.instances.get(d.app_id)
            if inst is None or inst.deployment is not d:
                return
            now = await self._scheduler_now(d, to)
            if now is not None:  # the next try goes there
                self.rt.rebound[d.app_id] = now
            if asyncio.get_running_loop().time() + wait > deadline:
                log.warning("app %s: gave up reporting %s to its scheduler", d.app_id, type)
                return
            log.warning("%s to the scheduler failed (%s); again in %.1f s", type, problem, wait)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 5.0)

    async def _scheduler_now(self, d: Deployment, tried: Address) -> Address | None:
        """Where the app's scheduler is, when ``tried`` did not take a report: the peer
        its record names, or the one that deployed it, if that peer says it schedules
        the app. (An adopter that rebound this peer and then restarted, while the
        scheduler it took over from came back and kept the app, rebinds nobody.)"""
        candidates: list[Address] = []
        with contextlib.suppress(AgiledartError):
            rec = AppRecord.from_wire(await self.rt.records.get(record_key("app", d.app_id)))
            candidates.append(rec.scheduler)
        candidates.append(d.scheduler)
        for addr in dict.fromkeys(candidates):
            if addr != tried and await self.rt.scheduler.still_scheduled(addr, d.app_id):
                return addr
        return None

    def scheduler_of(self, d: Deployment) -> Address:
        return self.rt.rebound.get(d.app_id, d.scheduler)

    async def app_rebind(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        """The app's scheduler died and ``scheduler`` adopted it: report there now."""
        app_id, to = app_id_of(req), req.get("scheduler")
        if not (isinstance(to, list) and len(to) == 2 and isinstance(to[0], str)):
            msg = "app_rebind needs 'scheduler': [host, port]"
            raise MalformedError(msg)
        inst = self.rt.instances.get(app_id)
        if type(to[1]) is not int or inst is None:
            return False
        new, current = (to[0], to[1]), self.scheduler_of(inst.deployment)
        if new != current and await self.rt.scheduler.still_scheduled(current, app_id):
            # a peer that only believes the scheduler dead (it was cut off, or the
            # scheduler was slow) must not take the app over: two schedulers would
            # follow it, and the one the CLI asks would never hear that it ended
            log.warning("app %s: not rebinding to %s, %s still schedules it", app_id, new, current)
            return False
        self.rt.rebound[app_id] = new
        return True

    async def tell(self, address: Address, type: str, body: dict[str, Any]) -> None:
        for attempt in range(3):
            try:
                await self.rt.links.request(address, type, body, timeout=30.0)
                return
            except AgiledartError as exc:
                log.warning("%s to the scheduler failed (%s), attempt %d", type, exc, attempt + 1)
                await asyncio.sleep(1.0)

    def instance(self, req: dict[str, Any]) -> AppInstance:
        app_id = app_id_of(req)
        inst = self.rt.instances.get(app_id)
        if inst is None:
            msg = f"app {app_id!r} is not deployed on {self.rt.name}"
            raise UnknownApp(msg)
        return inst

    def manifest_changed(self) -> None:
        """Publish which apps this peer hosts (``hosting:<name>``, replicated with the
        records store), for whoever takes over from it."""
        if self.rt._group is None:
            return
        apps = sorted(self.rt.instances)
        self.rt._background(self.publish_manifest(apps))

    async def publish_manifest(self, apps: list[str]) -> None:
        try:
            await self.rt.records.put(record_key("hosting", self.rt.name), {"apps": apps})
        except AgiledartError as exc:
            log.debug("hosting manifest not published: %s", exc)

    def holders(self, n: int) -> list[Holder]:
        """Where this peer's checkpoint fragments go: its n closest leaf-set peers."""
        return [
            Holder(c.name or f"{c.node_id:040x}", (c.host, c.port))
            for c in self.rt.overlay.leaf_set.members()[:n]
        ]

    async def app_barrier(self, req: dict[str, Any], conn: ConnectionInfo) -> dict[str, Any]:
        """The scheduler cuts epoch ``epoch``: barriers into this peer's sources (in the
        background: a source blocked by back-pressure takes its barrier when it moves)."""
        inst = self.instance(req)
        epoch = req.get("epoch")
        if type(epoch) is not int or generation_of(req) != inst.generation:
            return {"injected": False}
        # a child of the instance: a downstream peer lost while the barrier goes out
        # fails (and so recovers) the app, never this peer
        return {"injected": inst.spawn(inst.inject_barrier(epoch)) is not None}

    async def app_committed(self, req: dict[str, Any], conn: ConnectionInfo) -> bool:
        """The scheduler committed epoch ``epoch``: this peer's two-phase sinks of the
        app send its output, and its logged sources (mqtt, http) let go of what it
        covers (an mqtt source's held acknowledgements go to the broker)."""
        inst = self.instance(req)
        epoch = req.get("epoch")
        if type(epoch) is not int or generation_of(req) != inst.generation:
            return False
        inst.checkpoint_committed(epoch)
        return True

    async def report_checkpoint(self, d: Deployment, report: dict[str, Any]) -> None:
        if report.get("kind") == "state":  # a snapshot stored from here
            self.rt.checkpoint_bytes.observe(float(report.get("bytes", 0)))
            self.rt.checkpoint_seconds.observe(float(report.get("seconds", 0.0)))
        elif report.get("kind") == "state_failed":
            self.rt.checkpoint_failures += 1
        body = {"app_id": d.app_id, "report": report, "generation": d.generation}
        await self.tell(self.scheduler_of(d), "app_checkpoint", body)

    async def ask_scaling(self, d: Deployment, body: dict[str, Any]) -> None:
        """A controller here wants a scale-out or a migration: ask the app's scheduler."""
        try:
            await self.rt.links.request(
                self.scheduler_of(d),
                "app_scale",
                {**body, "generation": d.generation},
                timeout=10.0,
            )
        except AgiledartError as exc:
            log.warning("app_scale of %s to its scheduler failed: %s", d.app_id, exc)

    async def opstats_loop(self, interval_s: float = 1.0) -> None:
        """Trace every operator hosted here once a second (``opstats`` records)."""
        while True:
            await asyncio.sleep(interval_s)
            for app_id, inst in list(self.rt.instances.items()):
                for op, st in inst.statistics()["operators"].items():
                    self.rt.trace.emit(
                        "opstats",
                        app=app_id,
                        operator=op,
                        records_in=int(st.get("records_in", 0)),
                        records_out=int(st.get("records_out", 0)),
                        rate_in=float(st.get("rate") or 0.0),
                        queue=int(st.get("queued", 0)),
                        utilization=st.get("utilization"),
                        service_us=st.get("service_us"),
                    )


def generation_of(req: dict[str, Any]) -> int:
    g = req.get("generation", 0)
    return g if type(g) is int else 0


def app_id_of(req: dict[str, Any]) -> str:
    app_id = req.get("app_id")
    if not isinstance(app_id, str) or not app_id:
        msg = "this request needs 'app_id'"
        raise MalformedError(msg)
    return app_id
