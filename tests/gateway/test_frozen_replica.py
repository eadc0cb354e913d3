"""A frozen replica (its process stopped: SIGSTOP, a debugger, a wedged host) is fenced.

Its agent still reports it running, its host still links, so only its heartbeat channel tells:
the gateway pings it (`gateway.replica_watch`), and after a few seconds of silence stops the
replica through its agent and treats it as lost. A frozen executor no longer holds its
kernel's cells for as long as it is frozen (the chaos soak's stop-replica fault).
"""

from __future__ import annotations

import os
import signal

import pytest

from kernelfleet.testing import pid_alive, wait_for

pytestmark = pytest.mark.timeout(180)


async def test_a_frozen_executor_is_fenced_and_its_kernel_goes_on(fleet_factory):
    fleet = fleet_factory(hosts=3, gpus=0, replicas=3)
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    frozen = None
    try:
        assert (await client.execute("x = 41")).reply["status"] == "ok"
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        (frozen,) = [r for r in model["replicas"] if r["id"] == model["executor"]]
        os.kill(frozen["pid"], signal.SIGSTOP)

        # never answered by the frozen executor: run elsewhere once it is fenced
        result = await client.execute("print(x + 1)", timeout=90)
        assert result.stdout == "42\n", result.reply

        assert "answered no heartbeat" in fleet.log()
        wait_for(lambda: not pid_alive(frozen["pid"]), 30, "the frozen replica to be stopped")

        def whole() -> bool:
            now = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
            ready = [r for r in now["replicas"] if r["state"] in ("ready", "executing")]
            return len(ready) == 3 and frozen["id"] not in {r["id"] for r in now["replicas"]}

        wait_for(whole, 60, "a replacement of the frozen replica")
    finally:
        if frozen is not None and pid_alive(frozen["pid"]):
            os.kill(frozen["pid"], signal.SIGCONT)
        client.close()
