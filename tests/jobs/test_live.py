"""The job library and ``%schedule`` against a real fleet: a gateway, host agents, real job
processes (kernelfleet.jobs.sdk reporting their steps), and real notebook kernels whose cells run
the magic with their own kernel tokens.

One fleet for the module: 2 hosts x 2 virtual GPUs, kernels of one replica. Jobs are small Python
scripts that report a step every few milliseconds; each test waits for the states it needs with a
deadline, never a fixed sleep.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import pytest

from kernelfleet.client import FleetApiError, FleetClient
from kernelfleet.jobs import JobsClient
from kernelfleet.testing import Fleet, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TRAIN = textwrap.dedent(
    """\
    import os, sys, time
    from kernelfleet.jobs.sdk import current_job

    job = current_job()
    steps = int(os.environ["KERNELFLEET_JOB_STEPS"])
    step = job.load_checkpoint() or 0
    delay = float(sys.argv[1]) if len(sys.argv) > 1 else 0.01
    print("training from step", step, flush=True)
    while step < steps:
        if job.should_stop:
            job.save_checkpoint(step)
            sys.exit(0)
        time.sleep(delay)
        step += 1
        job.report(step, throughput=1 / delay)
    print("trained", step, "steps", flush=True)
    """
)
CRASH = "print('loading data', flush=True)\n1 / 0\n"


@pytest.fixture(scope="module")
def jobs_fleet(fleet_factory: Any) -> Fleet:
    return fleet_factory(hosts=2, gpus=2, replicas=1)


@pytest.fixture
def admin(jobs_fleet: Fleet) -> JobsClient:
    """The library with the fleet token, as an operator's script uses it."""
    return JobsClient(FleetClient(jobs_fleet.url, jobs_fleet.token))


@pytest.fixture
def kernel(jobs_fleet: Fleet) -> Any:
    """``await kernel()``: a kernel of the fleet and a websocket client of it."""
    kernels = []

    async def start() -> tuple[str, Any]:
        kernel_id = jobs_fleet.start_kernel()
        client = await jobs_fleet.connect(kernel_id)
        kernels.append((kernel_id, client))
        return kernel_id, client

    yield start
    for kernel_id, client in kernels:
        client.close()
        jobs_fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def text_of(reply: Any) -> str:
    results = reply.of_type("execute_result")
    assert results, f"no result: {reply.reply}"
    return str(results[-1]["content"]["data"]["text/plain"])


def error_line(reply: Any) -> str:
    assert reply.reply["status"] == "error", reply.reply
    (line,) = reply.reply["traceback"]  # one line, not a traceback through the client
    return str(line)


async def write(client: Any, name: str, source: str) -> None:
    reply = await client.execute(f"open({name!r}, 'w').write({source!r})")
    assert reply.reply["status"] == "ok", reply.reply


def logged(admin: JobsClient, job_id: str, line: str, timeout: float = 30) -> None:
    """Wait until `line` is among the job's log lines: the gateway keeps a finished run's log
    tail a moment after its exit is known."""
    wait_for(lambda: line in admin.logs(job_id).lines, timeout, f"{line!r} in {job_id}'s log")


def job_state(admin: JobsClient, job_id: str, *states: str, timeout: float = 60) -> Any:
    """The job's record once it is in one of `states`."""
    found: list[Any] = []

    def reached() -> bool:
        found[:] = [admin.job(job_id)]
        return found[0].state in states

    wait_for(reached, timeout, f"job {job_id} to be {' or '.join(states)}", interval=0.2)
    return found[0]


async def test_a_notebook_submits_a_script_and_follows_it_to_the_end(kernel, admin) -> None:
    kernel_id, client = await kernel()
    await write(client, "train.py", TRAIN)
    submitted = await client.execute("%schedule submit train.py --gpus 1 --steps 200 -- 0.03")
    assert submitted.reply["status"] == "ok", submitted.reply
    said = re.match(r"submitted (job-\S+) \(train\): 1 GPU, 200 steps, (\w+)", submitted.stdout)
    assert said, submitted.stdout
    job_id = said.group(1)
    record = admin.job(job_id)
    assert (record.owner_kernel, record.gpus, record.steps) == (kernel_id, 1, 200)

    running = job_state(admin, job_id, "running")  # 200 steps of 30 ms: 6 s to see it run
    shown = text_of(await client.execute("%schedule status"))
    row = next(line for line in shown.splitlines() if line.startswith(job_id))
    assert re.search(r"running\s+1\s+\d+%", row), row
    assert running.lease is not None
    assert f"{running.lease.host} [{running.lease.devices[0]}]" in row
    done = job_state(admin, job_id, "completed")
    assert done.steps_done == 200
    assert done.progress == 1.0
    one = text_of(await client.execute(f"%schedule status {job_id[4:8]}"))  # a short id
    assert f"job {job_id} · train" in one
    assert "100% (200 of 200 steps)" in one
    logged(admin, job_id, "trained 200 steps")
    logs = await client.execute(f"%schedule logs {job_id} --tail 1")
    assert text_of(logs).strip() == "trained 200 steps"


async def test_a_crashed_jobs_log_tail_reaches_status(kernel, admin) -> None:
    _, client = await kernel()
    await write(client, "crash.py", CRASH)
    submitted = await client.execute("%schedule submit crash.py --gpus 1 --steps 10 --name boom")
    job_id = re.search(r"submitted (job-\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]
    job_state(admin, job_id, "failed")
    logged(admin, job_id, "ZeroDivisionError: division by zero")  # then the error has the tail
    assert "ZeroDivisionError" in (admin.job(job_id).error or "")
    shown = text_of(await client.execute("%schedule status"))
    assert f"{job_id} failed:" in shown
    assert "ZeroDivisionError: division by zero" in shown
    assert "loading data" in shown


async def test_the_gateways_refusals_are_one_clear_line(kernel, admin) -> None:
    _, mine = await kernel()
    _, other = await kernel()
    await write(mine, "train.py", TRAIN)
    never = await mine.execute("%schedule submit train.py --gpus 3 --steps 10")
    line = error_line(never)
    assert line.startswith("FleetApiError: "), line
    assert "(409 never-fits)" in line, line
    assert "host-" in line  # names the largest host
    unknown = error_line(await mine.execute("%schedule cancel job-00000000"))
    assert "job-00000000" in unknown, unknown
    assert "(404 not-found)" in unknown, unknown

    submitted = await mine.execute("%schedule submit train.py --gpus 1 --steps 100000")
    job_id = re.search(r"submitted (job-\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]
    try:
        refused = error_line(await other.execute(f"%schedule cancel {job_id}"))
        assert "(403 forbidden)" in refused, refused
        cancelled = await mine.execute(f"%schedule cancel {job_id}")
        assert cancelled.stdout.startswith(f"cancelled {job_id} (train) at "), cancelled.stdout
        assert admin.job(job_id).state == "cancelled"
    finally:
        if not admin.job(job_id).finished:
            admin.cancel(job_id)


async def test_policy_and_simulate_show_what_the_gateway_offers(kernel, admin) -> None:
    _, client = await kernel()
    shown = text_of(await client.execute("%schedule policy"))
    policy = admin.policy()
    assert f"job policy: {policy.policy}" in shown
    assert "max_min_fairness" in policy.available
    try:
        switched = await client.execute("%schedule policy fifo")
        assert "the job policy is now fifo" in switched.stdout
        assert admin.policy().policy == "fifo"
        bad = error_line(await client.execute("%schedule policy no_such_policy"))
        assert "(400 " in bad, bad
    finally:
        admin.policy(policy.policy)
    simulate = "%schedule simulate --policy fifo --policy max_min_fairness"
    if not any(not job.finished for job in admin.status().jobs):
        assert "nothing to replay" in text_of(await client.execute(simulate))
    await write(client, "train.py", TRAIN)
    submitted = await client.execute("%schedule submit train.py --gpus 1 --steps 100000")
    job_id = re.search(r"submitted (job-\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]
    try:
        simulated = text_of(await client.execute(simulate))
        assert re.search(r"^fifo\s+\d+", simulated, re.M), simulated
        assert re.search(r"^max_min_fairness\s+\d+", simulated, re.M), simulated
    finally:
        admin.cancel(job_id)


def test_the_library_submits_a_function_and_reads_its_output(admin) -> None:
    def hello() -> None:
        print("hello from a pickled function", flush=True)

    job = admin.submit(hello, gpus=1, steps=1, name="hello")
    assert job.name == "hello"
    done = job_state(admin, job.id, "completed", "failed")
    assert done.state == "completed", done.error
    logged(admin, done.id, "hello from a pickled function")
    with pytest.raises(FleetApiError) as unknown:
        admin.logs("job-ffffffff")
    assert unknown.value.status == 404


async def test_fleet_shows_the_jobs_and_the_devices_lent_to_them(kernel, admin, jobs_fleet) -> None:
    _, client = await kernel()
    await write(client, "train.py", TRAIN)
    submitted = await client.execute("%schedule submit train.py --gpus 2 --steps 100000")
    job_id = re.search(r"submitted (job-\S+)", submitted.stdout).group(1)  # type: ignore[union-attr]
    try:
        running = job_state(admin, job_id, "running")
        assert running.lease is not None
        policy = text_of(await client.execute("%fleet policy"))
        assert re.search(
            r"background jobs\s+\d+ queued, [1-9]\d* running, [2-9]\d* GPUs lent", policy
        )
        hosts = text_of(await client.execute("%fleet hosts"))
        row = next(line for line in hosts.splitlines() if line.startswith(running.lease.host))
        assert row.endswith(f"{', '.join(running.lease.devices)} → {job_id}"), row
    finally:
        admin.cancel(job_id)


async def test_a_notebooks_function_runs_as_a_job(kernel, admin) -> None:
    _, client = await kernel()
    defined = await client.execute(
        "greeting = 'hello'\ndef greet():\n    print(greeting, 'from the notebook')"
    )
    assert defined.reply["status"] == "ok", defined.reply
    submitted = await client.execute("%schedule submit greet --gpus 1 --steps 1")
    said = re.match(r"submitted (job-\S+) \(greet\): 1 GPU, 1 step,", submitted.stdout)
    assert said, submitted.stdout
    done = job_state(admin, said.group(1), "completed", "failed")
    assert done.state == "completed", done.error
    logged(admin, done.id, "hello from the notebook")
