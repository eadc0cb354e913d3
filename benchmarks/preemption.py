"""A cell's start delay when its GPU is lent to a background job (cells first), against the same
cell on an idle GPU, in the same run.

    python benchmarks/preemption.py [--rounds 5] [--grace 30]

One fleet: a gateway and one host agent with 1 virtual GPU, kernels of 1 replica, job rounds of
1 s. A cell is ``%%gpus 1`` and prints ``time.time()`` as it starts; its start delay is that
time minus the time the client sent it (one machine, one clock). Three cases, `--rounds` cells
each:

- ``idle``: no job; the GPU is free;
- ``job (pickle checkpoint)``: a job runs on the GPU; it checkpoints a small dict (pickled) and
  exits when SIGTERM comes, so the cell waits for SIGTERM, the checkpoint and the exit;
- ``job (torch checkpoint)``: the same with a torch model and optimiser (``torch.save``).

Between two preempting cells the job is started again by the next round. Prints the figures
(median and max per case) and the grace period they stay under; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time

from kernelfleet.testing import kernel_reachable_folder, start_fleet, wait_for
from kernelfleet.testing.fleet import Fleet

PICKLE_JOB = """
import sys, time
from kernelfleet.jobs.sdk import current_job
job = current_job()
state = job.load_checkpoint() or {"step": 0, "weights": list(range(1000))}
for step in range(state["step"], job.steps):
    time.sleep(0.01)
    job.report(step + 1)
    if job.should_stop:
        job.save_checkpoint({**state, "step": step + 1})
        sys.exit(0)
"""

TORCH_JOB = """
import sys, time
import torch
from kernelfleet.jobs.sdk import current_job
job = current_job()
model = torch.nn.Linear(256, 256)
optimiser = torch.optim.Adam(model.parameters())
saved = job.load_checkpoint()
start = saved["step"] if saved else 0
for step in range(start, job.steps):
    optimiser.zero_grad()
    model(torch.randn(64, 256)).pow(2).mean().backward()
    optimiser.step()
    job.report(step + 1)
    if job.should_stop:
        job.save_checkpoint({"model": model.state_dict(), "optimiser": optimiser.state_dict(),
                             "step": step + 1})
        sys.exit(0)
"""

CELL = "%%gpus 1\nimport time\nprint(time.time())"


async def cell_delay(fleet: Fleet, kernel_id: str) -> float:
    client = await fleet.connect(kernel_id)
    try:
        sent = time.time()
        reply = await client.execute(CELL, timeout=120)
        assert reply.reply["status"] == "ok", reply.reply
        return float(reply.stdout.split()[0]) - sent  # then "ran on 1 GPU: 0"
    finally:
        client.close()


def job_running(fleet: Fleet, job_id: str) -> bool:
    job = fleet.api("GET", f"/api/fleet/jobs/{job_id}")
    return job["state"] == "running" and job["steps_done"] > 0 and job["lease"] is not None


async def measure(fleet: Fleet, kernel_id: str, rounds: int, job: str | None) -> list[float]:
    job_id = None
    if job is not None:
        body = {"source": job, "gpus": 1, "steps": 10**9, "name": "filler"}
        job_id = fleet.api("POST", "/api/fleet/jobs", body, expect=201)["id"]
    delays = []
    for _ in range(rounds):
        if job_id is not None:
            wait_for(lambda: job_running(fleet, job_id), 120, "the job to run (again)")
            await asyncio.sleep(0.5)  # let it train a little
        delays.append(await cell_delay(fleet, kernel_id))
    if job_id is not None:
        record = fleet.api("DELETE", f"/api/fleet/jobs/{job_id}")
        print(f"    job preempted {record['preemptions']} times, lost {record['lost_steps']} steps")
    return delays


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--grace", type=float, default=30.0)
    args = parser.parse_args()
    folder = kernel_reachable_folder()
    fleet = start_fleet(
        folder,
        hosts=1,
        gpus=1,
        gateway_args=("--GatewayApp.job_round_s=1", f"--GatewayApp.job_stop_grace={args.grace}"),
    )
    try:
        kernel_id = fleet.start_kernel()
        await cell_delay(fleet, kernel_id)  # warm: the kernel's first cell
        cases = {
            "idle": None,
            "job (pickle checkpoint)": PICKLE_JOB,
            "job (torch checkpoint)": TORCH_JOB,
        }
        print(f"cell start delay, {args.rounds} cells per case (grace {args.grace:g} s):")
        for name, job in cases.items():
            delays = await measure(fleet, kernel_id, args.rounds, job)
            print(
                f"  {name:<24} median {statistics.median(delays) * 1000:7.1f} ms   "
                f"max {max(delays) * 1000:7.1f} ms   all "
                + " ".join(f"{d * 1000:.0f}" for d in sorted(delays))
            )
    finally:
        fleet.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
