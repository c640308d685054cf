"""A sink's end reported to whichever peer schedules the app now (chaos seed 176).

An adopter rebound this peer's report to itself while the app's scheduler was frozen,
then restarted; the scheduler, back, kept the app and never rebinds anybody. The host
must find the scheduler from the app's record instead of asking the adopter for ever.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from agiledart import apps
from agiledart.runtime.appstate import AppRecord, AppState
from agiledart.runtime.deployment import Deployment
from agiledart.runtime.hosting import Hosting
from agiledart.runtime.links import Address
from agiledart.runtime.records import record_key

SCHEDULER: Address = ("127.0.0.9", 4000)
ADOPTER: Address = ("127.0.0.6", 4000)


def _runtime(d: Deployment, record: dict[str, Any]) -> tuple[Any, list[Address]]:
    asked: list[Address] = []

    async def request(to: Address, type: str, body: dict[str, Any], timeout: float) -> bool:
        asked.append(to)
        return to == SCHEDULER  # the restarted adopter does not schedule the app

    async def get(key: str) -> Any:
        return record if key == record_key("app", d.app_id) else None

    async def still_scheduled(address: Address, app_id: str) -> bool:
        return address == SCHEDULER

    rt = SimpleNamespace(
        links=SimpleNamespace(request=request),
        records=SimpleNamespace(get=get),
        scheduler=SimpleNamespace(still_scheduled=still_scheduled),
        instances={d.app_id: SimpleNamespace(deployment=d)},
        rebound={d.app_id: ADOPTER},
    )
    return rt, asked


def test_a_report_the_adopter_refuses_goes_to_the_scheduler_its_record_names() -> None:
    spec = apps.load("throughput")
    d = Deployment(app_id="a-1", spec=spec, hosts={}, addresses={}, scheduler=SCHEDULER)
    record = AppRecord(
        app_id="a-1",
        name="throughput",
        spec={},
        state=AppState.RUNNING,
        scheduler=SCHEDULER,
        scheduler_name="edge-4",
        submitted_at=0.0,
    ).to_wire()
    rt, asked = _runtime(d, record)
    hosting = Hosting(rt)

    async def report() -> None:
        await asyncio.wait_for(
            hosting.report_until_taken(d, "app_sink_done", {"app_id": "a-1"}), timeout=10
        )

    asyncio.run(report())
    assert asked == [ADOPTER, SCHEDULER]
    assert rt.rebound["a-1"] == SCHEDULER
