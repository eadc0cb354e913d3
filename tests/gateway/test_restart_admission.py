"""No kernel start fails for a host on its way; one no host can ever meet is a clear 4xx
(issue 12, item 3).

A gateway answers before its agents register (started beside them, or restarted): a kernel
asked for then waits for hosts, up to the launch timeout. A request the fleet can never meet
is refused at once with a 400: jupyter_server retries a 503, and shows a 4xx's message.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from tornado.httpclient import HTTPClientError

from kernelfleet.gateway.admission import Admission, NeverFits
from kernelfleet.gateway.records import KernelRecord
from kernelfleet.scheduler import FleetSnapshot, HostSnapshot, load_policy
from kernelfleet.testing import call_json

pytestmark = [pytest.mark.timeout(180)]


@pytest.mark.slow
async def test_a_kernel_asked_for_before_any_host_starts_once_hosts_register(private_fleet):
    fleet = private_fleet(hosts=0, replicas=3)
    assert fleet.api("GET", "/api/fleet/hosts") == []
    answer: list[tuple[int, object]] = []
    request = threading.Thread(
        target=lambda: answer.append(
            call_json(fleet.url + "/api/kernels", "POST", fleet.token, {"name": "python3"})
        )
    )
    request.start()
    for i in range(1, 4):
        fleet.start_host(f"host-{i}", 0)
    request.join(60)
    assert answer, "the start never answered"
    status, kernel = answer[0]
    assert status == 201, kernel
    assert isinstance(kernel, dict)
    client = await fleet.connect(kernel["id"])
    assert (await client.execute("print(6 * 7)")).stdout == "42\n"
    client.close()
    assert "waits: no host agent is alive yet" in fleet.log()
    assert len(fleet.api("GET", f"/api/fleet/kernels/{kernel['id']}")["replicas"]) == 3


async def test_a_kernel_no_host_can_ever_meet_is_a_4xx_through_jupyter_server(jp_fetch):
    """Through jupyter_server, as JupyterLab starts it: 8 GPUs on a fleet of 2-GPU hosts.

    jupyter_server (2.x) relays the gateway's status; its JSON answer, whose ``message``
    JupyterLab's "Error Starting Kernel" dialog shows, would hold ``Error from Gateway: [%s]
    %s`` (an unfilled template) without kernelfleet's extension: with it, the gateway's words."""
    with pytest.raises(HTTPClientError) as refused:
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3-8gpu"}))
    assert refused.value.code == 400, "not a 503, which jupyter_server retries"
    assert refused.value.response is not None
    shown = json.loads(refused.value.response.body)["message"]
    assert "can never start on this fleet" in shown, shown
    assert "needs 8 GPU(s) on one host; the largest has 2" in shown
    assert shown.endswith("[never-fits]"), shown
    assert "%s" not in shown
    assert "Error from Gateway" not in shown


# ---- the admission rules, over fleet snapshots ---------------------------------------------


class FixedFleet:
    """A `FleetView` stand-in: one snapshot, and the kernels waiting to be placed."""

    def __init__(self, *hosts: HostSnapshot, gpus_per_host: int = 0) -> None:
        self.now = FleetSnapshot(hosts=hosts, gpus_per_host=gpus_per_host)
        self.waiting: dict[str, int] = {}

    def snapshot(self, launch_name: str = "") -> FleetSnapshot:
        return self.now

    def in_containers(self, launch_name: str) -> bool:
        return False

    def admitting(self, kernel_id: str, gpus: int) -> None:
        self.waiting[kernel_id] = gpus

    def admitted(self, kernel_id: str) -> None:
        self.waiting.pop(kernel_id, None)


def kernel(replicas: int = 3, gpus: int = 0) -> KernelRecord:
    return KernelRecord(id="k1", name="python3", env={}, replicas_wanted=replicas, gpus=gpus)


def admission(fleet: FixedFleet, timeout: float = 0.2) -> Admission:
    return Admission(load_policy("notebookos"), fleet, timeout)  # type: ignore[arg-type]


async def test_more_replicas_than_the_fleet_can_ever_have_hosts_never_fit() -> None:
    fleet = FixedFleet(gpus_per_host=1)
    placing = admission(fleet)
    placing.max_hosts = 2
    with pytest.raises(NeverFits, match="its 3 replicas need as many distinct hosts") as refused:
        await placing.admit(kernel(replicas=3))
    assert refused.value.reason == "never-fits"
    assert fleet.waiting == {}


async def test_a_kernel_waits_for_hosts_still_to_register_then_says_what_it_waited_for() -> None:
    fleet = FixedFleet(HostSnapshot(id="h1", gpus_total=2))
    placing = admission(fleet, timeout=1.0)
    waiting = asyncio.ensure_future(placing.admit(kernel(replicas=3)))
    await asyncio.sleep(0.2)
    assert not waiting.done(), "two of its three hosts may still register"
    assert fleet.waiting == {"k1": 0}
    fleet.now = FleetSnapshot(
        hosts=tuple(HostSnapshot(id=f"h{i}", gpus_total=2) for i in (1, 2, 3))
    )
    assert sorted((await waiting).host_ids) == ["h1", "h2", "h3"]
    assert fleet.waiting == {}

    fleet.now = FleetSnapshot(hosts=(HostSnapshot(id="h1", gpus_total=2),))
    with pytest.raises(Exception, match="it needs 3 host\\(s\\) and 1 are alive") as late:
        await admission(fleet, timeout=0.3).admit(kernel(replicas=3))
    assert late.value.reason == "no-capacity"
