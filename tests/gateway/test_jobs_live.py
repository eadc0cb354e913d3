"""Background jobs on a live fleet: real host agents, real job processes (issue 13).

One host of 2 virtual GPUs, job rounds of 1-2 s. Job scripts use the SDK
(`kernelfleet.jobs.sdk`); the acceptance test trains a tiny seeded torch model on CPU.
"""

from __future__ import annotations

import pytest

from kernelfleet.testing import wait_for

COUNTER = """
import os, sys, time
from kernelfleet.jobs.sdk import current_job
job = current_job()
print("devices", os.environ["CUDA_VISIBLE_DEVICES"], "uid", os.getuid(), flush=True)
state = job.load_checkpoint() or {"step": 0}
for step in range(state["step"], job.steps):
    time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0.02)
    job.report(step + 1)
    if job.should_stop:
        job.save_checkpoint({"step": step + 1})
        sys.exit(0)
print("done", flush=True)
"""

STUBBORN = """
import signal, time
from kernelfleet.jobs.sdk import current_job
job = current_job()
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to the stop request
for step in range(job.steps):
    time.sleep(0.03)
    job.report(step + 1)
    if step + 1 == 5:
        job.save_checkpoint({"step": 5})
"""

CRASHER = "print('about to fail', flush=True)\nraise SystemExit('the data set is missing')\n"


@pytest.fixture(scope="module")
def jobs_fleet(fleet_factory):
    return fleet_factory(
        hosts=1,
        gpus=2,
        gateway_args=("--GatewayApp.job_round_s=1", "--GatewayApp.job_stop_grace=2"),
    )


def job_state(fleet, job_id):
    return fleet.api("GET", f"/api/fleet/jobs/{job_id}")


def lent_to(fleet):
    """The jobs the hosts' devices are lent to (None for a device lent to none)."""
    hosts = fleet.api("GET", "/api/fleet/hosts")
    return {device["lent_to_job"] for host in hosts for device in host["gpus"]["devices"]}


def wait_state(fleet, job_id, states, timeout=30):
    wait_for(lambda: job_state(fleet, job_id)["state"] in states, timeout, f"{job_id} {states}")
    return job_state(fleet, job_id)


def test_a_job_runs_on_its_leased_gpu_as_its_own_user_and_completes(jobs_fleet):
    fleet = jobs_fleet
    job = fleet.api(
        "POST",
        "/api/fleet/jobs",
        {"source": COUNTER, "gpus": 1, "steps": 30, "name": "counter"},
        expect=201,
    )
    assert job["state"] == "queued"
    assert job["name"] == "counter"
    running = wait_state(fleet, job["id"], {"running", "completed"})
    assert running["lease"] is None or running["lease"]["devices"] in (["0"], ["1"])
    done = wait_state(fleet, job["id"], {"completed", "failed"})
    assert done["state"] == "completed", done
    assert done["steps_done"] == 30
    assert done["exit_code"] == 0
    assert done["throughput"]["virtual"] > 0, "learned from the job's reports"
    wait_for(lambda: job_state(fleet, job["id"])["log_tail"], 10, "the log tail, collected")
    done = job_state(fleet, job["id"])
    devices, uid = done["log_tail"][0].split()[1], int(done["log_tail"][0].split()[3])
    assert devices in ("0", "1")
    assert "done" in done["log_tail"]
    if fleet.api("GET", "/api/fleet/hosts")[0]["isolation"]["kernel_user"] == "per-kernel":
        assert uid >= 2**24, "a job runs as a user of its own"
    listed = fleet.api("GET", "/api/fleet/jobs")
    assert listed["policy"] == "max_min_fairness"
    assert [j["id"] for j in listed["jobs"]][-1] == job["id"], "newest last"


def test_a_pickled_function_runs_as_a_job(jobs_fleet):
    import base64

    import cloudpickle

    def train():  # defined here: pickled by value, as a notebook's function is
        from kernelfleet.jobs.sdk import current_job

        job = current_job()
        for step in range(job.steps):
            job.report(step + 1)
        return f"trained {job.steps} steps as {job.id}"

    function = base64.b64encode(cloudpickle.dumps(train)).decode()
    body = {"function": function, "gpus": 2, "steps": 7}
    job = jobs_fleet.api("POST", "/api/fleet/jobs", body, expect=201)
    done = wait_state(jobs_fleet, job["id"], {"completed", "failed"})
    assert done["state"] == "completed", done
    assert done["steps_done"] == 7
    wait_for(lambda: job_state(jobs_fleet, job["id"])["log_tail"], 10, "the log tail")
    assert job_state(jobs_fleet, job["id"])["log_tail"] == [f"trained 7 steps as {job['id']}"]


def test_a_crashing_job_fails_with_its_log_tail(jobs_fleet):
    fleet = jobs_fleet
    job = fleet.api(
        "POST", "/api/fleet/jobs", {"source": CRASHER, "gpus": 1, "steps": 5}, expect=201
    )
    failed = wait_state(fleet, job["id"], {"failed", "completed"})
    assert failed["state"] == "failed"
    assert failed["exit_code"] == 1
    wait_for(
        lambda: "the data set is missing" in (job_state(fleet, job["id"])["error"] or ""),
        10,
        "the log tail in the error",
    )
    record = job_state(fleet, job["id"])
    assert "about to fail" in record["error"]
    assert "about to fail" in record["log_tail"]
    logs = fleet.api("GET", f"/api/fleet/jobs/{job['id']}/logs?tail=1")
    assert logs == {"id": job["id"], "lines": [record["log_tail"][-1]]}


def test_bad_requests_get_the_issues_answers(jobs_fleet):
    fleet = jobs_fleet
    status, body = fleet.request(
        "POST", "/api/fleet/jobs", {"source": COUNTER, "gpus": 3, "steps": 5}
    )
    assert status == 409
    assert body["reason"] == "never-fits"
    assert "host-1" in body["message"]
    assert "has 2" in body["message"]
    status, body = fleet.request("GET", "/api/fleet/jobs/job-00000000")
    assert status == 404
    assert "job-00000000" in body["message"]
    for bad in (
        {"gpus": 1, "steps": 5},
        {"source": "x", "gpus": 0, "steps": 5},
        {"source": "x", "gpus": 1, "steps": 5, "weight": -1},
    ):
        status, body = fleet.request("POST", "/api/fleet/jobs", bad)
        assert (status, body["reason"]) == (400, "invalid-request"), bad
    status, body = fleet.request("PUT", "/api/fleet/jobs/policy", {"policy": "nope"})
    assert status == 400
    assert "nope" in body["message"]
    policy = fleet.api("GET", "/api/fleet/jobs/policy")
    assert "max_min_fairness" in policy["available"]


def test_a_kernel_cancels_its_own_jobs_only_and_a_job_token_only_reports(jobs_fleet):
    fleet = jobs_fleet
    kernels = [fleet.start_kernel() for _ in range(2)]
    tokens = [_kernel_token(fleet, kernel_id) for kernel_id in kernels]
    try:
        status, job = fleet.request(
            "POST",
            "/api/fleet/jobs",
            {"source": COUNTER, "gpus": 1, "steps": 100000, "args": ["0.05"]},
            token=tokens[0],
        )
        assert status == 201
        assert job["owner_kernel"] == kernels[0]
        status, body = fleet.request("DELETE", f"/api/fleet/jobs/{job['id']}", token=tokens[1])
        assert status == 403
        assert body["reason"] == "forbidden"
        wait_for(lambda: job_state(fleet, job["id"])["steps_done"] > 0, 20, "the job to run")
        status, cancelled = fleet.request("DELETE", f"/api/fleet/jobs/{job['id']}", token=tokens[0])
        assert status == 200
        assert cancelled["state"] == "cancelled", cancelled
        assert cancelled["exit_code"] == 0, "it checkpointed and exited on SIGTERM"
        status, _ = fleet.request(
            "POST", f"/api/fleet/jobs/{job['id']}/progress", {"steps_done": 1}, token=tokens[0]
        )
        assert status == 403, "a kernel's token reports no job's progress"
    finally:
        for kernel_id in kernels:
            fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def test_a_job_that_ignores_the_stop_request_is_killed_and_its_lost_work_reported(jobs_fleet):
    fleet = jobs_fleet
    body = {"source": STUBBORN, "gpus": 1, "steps": 100000}
    job = fleet.api("POST", "/api/fleet/jobs", body, expect=201)
    wait_for(
        lambda: job_state(fleet, job["id"])["steps_done"] > 20, 20, "steps past its checkpoint"
    )
    cancelled = fleet.api("DELETE", f"/api/fleet/jobs/{job['id']}")
    assert cancelled["state"] == "cancelled"
    assert cancelled["exit_code"] == -9, "killed after the 2 s grace"
    assert cancelled["lost_steps"] > 15, "the steps since its checkpoint at step 5"
    assert cancelled["steps_done"] == 5


def test_simulate_is_a_what_if_of_the_queue_with_the_learned_throughputs(jobs_fleet):
    fleet = jobs_fleet
    body = {"source": COUNTER, "gpus": 1, "steps": 100000, "args": ["0.01"]}
    job = fleet.api("POST", "/api/fleet/jobs", body, expect=201)
    wait_for(lambda: job_state(fleet, job["id"])["throughput"], 20, "a learned throughput")
    rate = job_state(fleet, job["id"])["throughput"]["virtual"]
    answer = fleet.api(
        "POST", "/api/fleet/jobs/simulate", {"policies": ["max_min_fairness", "fifo"]}
    )
    assert set(answer["policies"]) == {"max_min_fairness", "fifo"}
    figures = answer["policies"]["fifo"]
    assert figures["jobs"] == 1
    left = 100000 - job_state(fleet, job["id"])["steps_done"]
    assert figures["makespan_s"] == pytest.approx(left / rate, rel=0.5), "at the learned rate"
    status, error = fleet.request("POST", "/api/fleet/jobs/simulate", {"policies": ["nope"]})
    assert status == 400
    assert "nope" in error["message"]
    fleet.api("DELETE", f"/api/fleet/jobs/{job['id']}")


def _kernel_token(fleet, kernel_id):
    from kernelfleet.gateway.kernel_tokens import KernelTokens

    return KernelTokens(fleet.token).issue(kernel_id)


TRAIN = """
import sys, time
import torch
from kernelfleet.jobs.sdk import current_job

job = current_job()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
optimiser = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
true_w = torch.arange(8, dtype=torch.float32).unsqueeze(1) / 8
start = 0
saved = job.load_checkpoint()
if saved is not None:
    model.load_state_dict(saved["model"])
    optimiser.load_state_dict(saved["optimiser"])
    start = saved["step"]
    print("resumed at", start, flush=True)


def batch(step):
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(1000 + step))
    return x, torch.sin(x @ true_w)


def save(step):
    job.save_checkpoint({"model": model.state_dict(), "optimiser": optimiser.state_dict(),
                         "step": step}, step=step)


for step in range(start, job.steps):
    x, y = batch(step)
    optimiser.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimiser.step()
    time.sleep(0.01)
    job.report(step + 1)
    if job.should_stop:
        save(step + 1)
        sys.exit(0)
    if (step + 1) % 50 == 0:
        save(step + 1)
x, y = batch(-1)
with torch.no_grad():
    print(f"final loss {torch.nn.functional.mse_loss(model(x), y).item():.10f}", flush=True)
"""
STEPS = 400


def reference_loss(tmp_path):
    """The final loss of the same training run uninterrupted, outside the fleet."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "KERNELFLEET_JOB_STEPS": str(STEPS),
           "KERNELFLEET_JOB_CHECKPOINT": str(tmp_path / "reference")}  # fmt: skip
    env.pop("KERNELFLEET_GATEWAY_URL", None)
    out = subprocess.run(
        [sys.executable, "-c", TRAIN], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return final_loss(out.stdout.splitlines())


def final_loss(lines):
    found = [line.split()[-1] for line in lines if line.startswith("final loss")]
    assert found, lines
    return found[-1]


@pytest.mark.slow
async def test_two_jobs_share_the_gpus_a_cell_preempts_one_and_it_resumes_to_the_same_loss(
    private_fleet, tmp_path
):
    fleet = private_fleet(
        hosts=1,
        gpus=2,
        gateway_args=("--GatewayApp.job_round_s=2", "--GatewayApp.job_stop_grace=20"),
    )
    expected = reference_loss(tmp_path)
    jobs = [
        fleet.api("POST", "/api/fleet/jobs", {"source": TRAIN, "gpus": 1, "steps": STEPS,
                                              "name": name}, expect=201)["id"]
        for name in ("a", "b")
    ]  # fmt: skip
    wait_for(lambda: all(job_state(fleet, j)["steps_done"] > 20 for j in jobs), 60, "both run")
    leases = [job_state(fleet, j)["lease"]["devices"] for j in jobs]
    assert sorted(leases) == [["0"], ["1"]], "two jobs share the 2 GPUs"
    assert lent_to(fleet) == set(jobs)
    assert fleet.api("GET", "/api/fleet")["jobs"] == {"queued": 0, "running": 2, "gpus_lent": 2}

    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        reply = await client.execute(
            "%%gpus 1\nimport os\nprint('cell on', os.environ['KERNELFLEET_GPUS'])", timeout=60
        )
        assert reply.reply["status"] == "ok", reply.reply
        device = reply.stdout.split()[-1]
        preempted = [j for j, lease in zip(jobs, leases, strict=True) if lease == [device]]
        record = job_state(fleet, preempted[0])
        assert record["preemptions"] >= 1, record
        assert record["lost_steps"] == 0, "it checkpointed within the grace period"
    finally:
        client.close()
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)

    done = [wait_state(fleet, j, {"completed", "failed"}, timeout=240) for j in jobs]
    assert [d["state"] for d in done] == ["completed", "completed"], done
    assert done[jobs.index(preempted[0])]["restarts"] >= 1
    for job_id in jobs:
        lines = fleet.api("GET", f"/api/fleet/jobs/{job_id}/logs?tail=50")["lines"]
        assert final_loss(lines or job_state(fleet, job_id)["log_tail"]) == expected


@pytest.mark.slow
def test_jobs_survive_a_killed_gateway_and_finish(private_fleet):
    fleet = private_fleet(hosts=1, gpus=2, gateway_args=("--GatewayApp.job_round_s=1",))
    running = [
        fleet.api("POST", "/api/fleet/jobs", {"source": COUNTER, "gpus": 1, "steps": 250,
                                              "args": ["0.03"]}, expect=201)["id"]
        for _ in range(2)
    ]  # fmt: skip
    wait_for(lambda: all(job_state(fleet, j)["steps_done"] > 30 for j in running), 30, "runs")
    queued = fleet.api("POST", "/api/fleet/jobs", {"source": COUNTER, "gpus": 2, "steps": 20},
                       expect=201)["id"]  # fmt: skip
    before = {j: job_state(fleet, j) for j in running}
    assert job_state(fleet, queued)["state"] == "queued"

    fleet.restart_gateway()  # SIGKILL, then a new gateway on the same state dir and port

    after = {j: job_state(fleet, j) for j in running}
    for job_id in running:
        assert after[job_id]["state"] == "running"
        assert after[job_id]["steps_done"] >= before[job_id]["steps_done"], "progress kept"
    assert job_state(fleet, queued)["state"] == "queued"
    wait_for(lambda: bool(lent_to(fleet) & set(running)), 10, "the running jobs to be re-linked")
    done = [wait_state(fleet, j, {"completed", "failed"}, timeout=60) for j in [*running, queued]]
    assert [d["state"] for d in done] == ["completed"] * 3, done
    for record in done[:2]:
        # the 2-GPU job's turns preempt them (max-min fairness); the gateway's restart did not
        assert record["restarts"] == record["preemptions"], "re-linked, not restarted"
        assert record["lost_steps"] == 0
        assert record["steps_done"] == 250
        assert record["exit_code"] == 0


def test_hosts_advertise_gpu_types_and_jobs_learn_a_throughput_on_each(private_fleet):
    aware = ("--GatewayApp.job_round_s=1", "--GatewayApp.job_policy=max_min_fairness_perf")
    fleet = private_fleet(hosts=1, gpus=1, gateway_args=aware)
    fleet.start_host("host-k80", 1, "--gpu-type", "k80")
    types = {host["id"]: host["gpus"]["type"] for host in fleet.api("GET", "/api/fleet/hosts")}
    assert types == {"host-1": "virtual", "host-k80": "k80"}
    body = {"source": COUNTER, "gpus": 1, "steps": 60}
    jobs = [fleet.api("POST", "/api/fleet/jobs", body, expect=201)["id"] for _ in range(2)]
    done = [wait_state(fleet, j, {"completed", "failed"}) for j in jobs]
    assert [d["state"] for d in done] == ["completed", "completed"]
    learned = set().union(*(d["throughput"] for d in done))
    assert learned == {"virtual", "k80"}, "one job ran on each type"


@pytest.mark.slow
def test_a_restarted_agent_adopts_its_job_and_the_gateway_keeps_one_run_of_it(private_fleet):
    import os
    import signal

    fleet = private_fleet(hosts=1, gpus=1, gateway_args=("--GatewayApp.job_round_s=1",))
    body = {"source": COUNTER, "gpus": 1, "steps": 200, "args": ["0.03"]}
    job = fleet.api("POST", "/api/fleet/jobs", body, expect=201)["id"]
    wait_for(lambda: job_state(fleet, job)["steps_done"] > 30, 30, "the job to run")
    os.killpg(fleet.hosts["host-1"].pid, signal.SIGKILL)  # the agent alone: its job runs on
    fleet.hosts["host-1"].wait(10)
    fleet.start_host("host-1", 1)
    done = wait_state(fleet, job, {"completed", "failed"}, timeout=60)
    assert done["state"] == "completed", done
    assert "adopted" in fleet.log("host-1")
    # the agent's loss was seen at once (its link closed): the job was queued again; the process
    # the restarted agent adopted was stopped as a stray (until then the agent refuses a second
    # run of the job), so one run of the job went on
    assert "not placed there: stopping it" in fleet.log()
    assert done["restarts"] >= 1


@pytest.mark.slow
async def test_a_preempted_job_resumes_soon_after_the_cell_not_a_round_later(private_fleet):
    """Rounds of 10 minutes, resumption 1 s after cells release GPUs: the job the cell took the
    GPU from runs again within seconds of the cell's end."""
    fleet = private_fleet(
        hosts=1,
        gpus=1,
        gateway_args=("--GatewayApp.job_round_s=600", "--GatewayApp.job_resume_after_s=1"),
    )
    job_id = fleet.api("POST", "/api/fleet/jobs", {"source": COUNTER, "gpus": 1, "steps": 100_000},
                       expect=201)["id"]  # fmt: skip
    wait_for(lambda: job_state(fleet, job_id)["steps_done"] > 5, 30, "the job runs")
    kernel_id = fleet.start_kernel()
    client = await fleet.connect(kernel_id)
    try:
        # the round the preemption wakes comes while the cell still holds the GPU
        reply = await client.execute("%%gpus 1\nimport time; time.sleep(3)", timeout=60)
        assert reply.reply["status"] == "ok", reply.reply
        assert job_state(fleet, job_id)["preemptions"] == 1
        # no check that it is queued now: 1 s after the release it may already run again
        running = wait_state(fleet, job_id, {"running"}, timeout=20)  # not 600 s
        assert running["restarts"] >= 1, "stopped by the cell and started again"
    finally:
        client.close()
        fleet.api("DELETE", f"/api/fleet/jobs/{job_id}")
        fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)
