"""``kernelfleet simulate-jobs``: a job trace through the job policies on a simulated cluster.

    kernelfleet simulate-jobs --trace FILE --throughputs FILE --cluster v100=8,p100=16,k80=24 \
        --policy NAME [--policy NAME ...] [--round-s 360] [--seed 0] [--config FILE] \
        --json OUT [--plot OUT.png]

Prints a summary table on stdout and a progress bar on stderr. ``--json`` writes exactly
``{"policies": {NAME: {"avg_jct_s", "makespan_s", "utilisation", "ftf_rho": {"median", "p75",
"max", "unfair_share"}, "jobs": N}}}`` (tools outside the project read it: keep it stable).
``--config`` names a JSON object of policy options, ``{NAME: {option: value}}``, given to each
policy's constructor; a flat object (like Shockwave's ``configurations/*.json``) goes to
``shockwave``. ``--conventions shockwave`` simulates as Shockwave's simulator does (a resumed
job pays 20 s, allocations every 1000 s, rho over the job's pre-generated profile) instead of
Gavel's (docs/jobs-simulator.md). Bad input ends with a one-line error and exit code 2.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from traitlets import Bool, Enum, Float, Int, List, TraitError, Unicode, validate
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.jobs.dynamics import dynamic_jobs_from_trace
from kernelfleet.scheduler.jobs.policy import JobPolicy, available_job_policies, load_job_policy
from kernelfleet.scheduler.jobs.simulator import (
    GAVEL_REALLOCATION_INTERVAL_S,
    SHOCKWAVE_REALLOCATION_INTERVAL_S,
    SHOCKWAVE_RESUME_OVERHEAD_S,
    JobsRunResult,
    SimulatedJob,
    jobs_from_trace,
    simulate_jobs,
)
from kernelfleet.scheduler.jobs.throughputs import ThroughputTable
from kernelfleet.scheduler.jobs.traces import JOB_TRACE_HELP, read_job_trace
from kernelfleet.scheduler.simulator.plot import require_matplotlib

log = logging.getLogger("kernelfleet.scheduler.jobs.app")


def parse_cluster(text: str) -> dict[str, int]:
    """``"v100=8,p100=16"`` -> ``{"v100": 8, "p100": 16}``; `InvalidRequest` says what is wrong."""
    cluster: dict[str, int] = {}
    for part in text.split(","):
        name, equals, count = part.strip().partition("=")
        if not equals or not name.strip() or not count.strip().isdigit():
            raise InvalidRequest(
                f"bad --cluster {text!r}: write GPU type=count pairs, e.g. v100=8,p100=16,k80=24"
            )
        if name.strip() in cluster:
            raise InvalidRequest(f"bad --cluster {text!r}: {name.strip()} is named twice")
        cluster[name.strip()] = int(count)
    if sum(cluster.values()) == 0:
        raise InvalidRequest(f"bad --cluster {text!r}: no GPUs")
    return cluster


def policy_options(path: str, names: list[str]) -> dict[str, dict[str, Any]]:
    """The ``--config`` file's options per policy name (see the module docstring)."""
    if not path:
        return {}
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as error:
        raise InvalidRequest(f"cannot read --config {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"--config {path} is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise InvalidRequest(f"--config {path}: expected a JSON object")
    known = set(available_job_policies()) | set(names)
    if document and all(key in known and isinstance(v, dict) for key, v in document.items()):
        return {name: dict(options) for name, options in document.items()}
    return {"shockwave": {"config": path}}  # Shockwave's own configuration file


def build_policy(name: str, options: Mapping[str, Any]) -> JobPolicy:
    """The registered policy ``name`` with ``options``; `InvalidRequest` when it cannot be."""
    try:
        return load_job_policy(name, **options)
    except (ImportError, AttributeError) as error:
        raise InvalidRequest(
            f"job policy {name!r} is registered but not installed: {error}"
        ) from None
    except (TypeError, ValueError) as error:
        raise InvalidRequest(f"bad options for job policy {name!r}: {error}") from None


class SimulateJobsApp(Application):
    """Trace-driven simulation of the background-job policies (Gavel's, Shockwave's)."""

    name = "kernelfleet-simulate-jobs"
    version = __version__
    description = "Simulate a job trace through Gavel's and Shockwave's policies."
    aliases = {
        "trace": "SimulateJobsApp.trace",
        "throughputs": "SimulateJobsApp.throughputs",
        "cluster": "SimulateJobsApp.cluster",
        "policy": "SimulateJobsApp.policies",
        "round-s": "SimulateJobsApp.round_s",
        "seed": "SimulateJobsApp.seed",
        "config": "SimulateJobsApp.policy_config",
        "json": "SimulateJobsApp.json_path",
        "plot": "SimulateJobsApp.plot_path",
        "fallback": "SimulateJobsApp.fallback",
        "conventions": "SimulateJobsApp.conventions",
    }

    trace = Unicode("", config=True, help=JOB_TRACE_HELP)
    throughputs = Unicode(
        "", config=True, help="The throughput table: Gavel's JSON ({gpu: {(job, scale): ...}})."
    )
    cluster = Unicode(
        "v100=8,p100=16,k80=24", config=True, help="GPUs per type: type=count pairs, commas."
    )
    policies = List(
        Unicode(), ["max_min_fairness"], config=True, help="Policies to simulate (repeat --policy)."
    )
    round_s = Float(360.0, config=True, help="Length of a scheduling round, seconds.")
    seed = Int(0, config=True, help="Seed of the mechanism's and the policies' random choices.")
    policy_config = Unicode("", config=True, help="JSON file of policy options (see the docs).")
    fallback = Unicode(
        "fifo_perf", config=True, help="Policy whose allocation is used when a solver fails."
    )
    conventions = Enum(
        ["gavel", "shockwave"],
        "gavel",
        config=True,
        help="Whose simulator to imitate: gavel (no resume cost, allocations every 1920 s) or "
        "shockwave (20 s per resume, every 1000 s, rho over the job's profile).",
    )
    json_path = Unicode("", config=True, help="Write the results as JSON to this file.")
    plot_path = Unicode("", config=True, help="Draw the results into this PNG (matplotlib).")
    progress = Bool(True, config=True, help="Show a progress bar on stderr.")

    @validate("policies")
    def _check_policies(self, proposal: dict) -> list[str]:
        if not proposal["value"]:
            raise TraitError("give at least one --policy")
        return list(proposal["value"])

    def start(self) -> None:
        try:
            self._run()
        except InvalidRequest as error:
            print(f"kernelfleet simulate-jobs: {error.message}", file=sys.stderr)
            self.exit(2)

    def _run(self) -> None:
        if not self.trace or not self.throughputs:
            raise InvalidRequest(
                "give the job trace and the throughput table: --trace --throughputs"
            )
        if self.round_s <= 0:
            raise InvalidRequest(f"--round-s must be positive, got {self.round_s:g}")
        cluster = parse_cluster(self.cluster)
        options = policy_options(self.policy_config, self.policies)
        seeded = {"fifo": {"seed": self.seed}}
        policies = [
            build_policy(name, {**seeded.get(name, {}), **options.get(name, {})})
            for name in self.policies
        ]
        fallback = build_policy(self.fallback, {})
        if self.plot_path:
            require_matplotlib()
        table = ThroughputTable.load(self.throughputs)
        trace = read_job_trace(self.trace)
        if any(entry.mode != "static" for entry in trace):
            jobs = dynamic_jobs_from_trace(
                trace, table, cluster, alone_from_profile=self.conventions == "shockwave"
            )
        else:
            jobs = jobs_from_trace(trace, table, cluster)
        print(
            f"Trace {self.trace}: {len(jobs)} jobs; cluster "
            + ", ".join(f"{count} {gpu}" for gpu, count in cluster.items())
            + f"; {self.round_s:g} s rounds; throughputs {self.throughputs}"
        )
        results = {}
        for policy in policies:
            started = time.monotonic()
            results[policy.name] = self._simulate(jobs, cluster, policy, fallback)
            wall = time.monotonic() - started
            if self.progress:
                print(file=sys.stderr)
            for reason in results[policy.name].fallbacks:
                log.warning("%s fell back to %s: %s", policy.name, fallback.name, reason)
            print(f"{policy.name}: simulated in {wall:.1f} s")
        print(results_table(results))
        if self.json_path:
            document = {"policies": {name: r.as_document() for name, r in results.items()}}
            Path(self.json_path).write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        if self.plot_path:
            plot(results, self.plot_path)
            print(f"plot written to {self.plot_path}")

    def _simulate(
        self,
        jobs: list[SimulatedJob],
        cluster: dict[str, int],
        policy: JobPolicy,
        fallback: JobPolicy,
    ) -> JobsRunResult:
        shockwave = self.conventions == "shockwave"
        return simulate_jobs(
            jobs,
            cluster,
            policy,
            round_s=self.round_s,
            seed=self.seed,
            progress=self._progress_bar(policy.name) if self.progress else None,
            fallback=fallback,
            reallocation_interval_s=(
                SHOCKWAVE_REALLOCATION_INTERVAL_S if shockwave else GAVEL_REALLOCATION_INTERVAL_S
            ),
            resume_overhead_s=SHOCKWAVE_RESUME_OVERHEAD_S if shockwave else 0.0,
        )

    def _progress_bar(self, name: str) -> Callable[[float], None]:
        last = [0.0]

        def show(fraction: float) -> None:
            now = time.monotonic()
            if now - last[0] >= 0.2 or fraction >= 1.0:
                last[0] = now
                bar = "#" * int(fraction * 30)
                sys.stderr.write(f"\rsimulating {name:<26} [{bar:<30}] {fraction:4.0%} of jobs")
                sys.stderr.flush()

        return show


def results_table(results: Mapping[str, JobsRunResult]) -> str:
    """One line per policy: JCT, makespan, utilisation, finish-time fairness."""
    header = (
        f"{'policy':<28}{'jobs':>6}{'avg JCT h':>11}{'makespan h':>12}{'util':>7}"
        f"{'rho med':>9}{'rho p75':>9}{'rho max':>9}{'unfair':>8}"
    )
    lines = [header, "-" * len(header)]
    for name, result in results.items():
        rho = result.ftf_rho
        lines.append(
            f"{name:<28}{result.jobs:>6}{result.avg_jct_s / 3600:>11.2f}"
            f"{result.makespan_s / 3600:>12.2f}{result.utilisation:>7.1%}"
            f"{rho.median:>9.2f}{rho.p75:>9.2f}{rho.max:>9.2f}{rho.unfair_share:>8.0%}"
        )
    return "\n".join(lines)


def plot(results: Mapping[str, JobsRunResult], path: str | Path) -> None:
    """Busy GPUs over time per policy, and the JCT CDFs, into one PNG."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    figure, (busy, cdf) = plt.subplots(2, 1, figsize=(11, 7))
    for name, result in results.items():
        times = [t / 3600 for t, _ in result.busy_history]
        busy.step(times, [gpus for _, gpus in result.busy_history], where="post", label=name)
        jcts = sorted(outcome.jct_s / 3600 for outcome in result.outcomes)
        cdf.step(jcts, [(i + 1) / len(jcts) for i in range(len(jcts))], where="post", label=name)
    busy.set_xlabel("hours since the first arrival")
    busy.set_ylabel("GPUs running jobs")
    cdf.set_xlabel("job completion time, hours")
    cdf.set_ylabel("fraction of jobs")
    for axis in (busy, cdf):
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
