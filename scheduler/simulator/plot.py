"""``--plot``: provisioned vs busy GPUs over time per policy, the start-delay CDFs, and the
cost/delay trade-off (provisioned GPU-hours against p95 start delay, one point per policy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.simulator.metrics import PolicyResult

MAX_POINTS = 4000


def require_matplotlib() -> None:
    """`InvalidRequest` saying how to install matplotlib if it is missing; call it before a
    long run whose results are to be plotted."""
    try:
        import matplotlib
    except ImportError:
        raise InvalidRequest(
            '--plot needs matplotlib: pip install matplotlib (or "kernelfleet[plot]")'
        ) from None
    matplotlib.use("Agg")


def plot(results: dict[str, PolicyResult], path: str | Path) -> None:
    """Write a PNG with one time panel per policy, a CDF panel and a trade-off panel;
    matplotlib is optional."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    panels = len(results) + 2
    figure, axes = plt.subplots(panels, 1, figsize=(11, 3 * panels))
    for axis, (name, result) in zip(axes, results.items(), strict=False):
        for label, history in (
            ("provisioned GPUs", result.provisioned_history),
            ("busy GPUs", result.busy_history),
        ):
            times, values = _thin(history)
            axis.step(times, values, where="post", label=label, linewidth=0.7)
        axis.set_title(name)
        axis.set_xlabel("hours since the trace starts")
        axis.set_ylabel("GPUs")
        axis.legend(loc="upper right")
    cdf = axes[-2]
    for name, result in results.items():
        delays = sorted(result.delays_s)
        if delays:
            fractions = [(i + 1) / len(delays) for i in range(len(delays))]
            cdf.step(delays, fractions, where="post", label=name)
    cdf.set_xscale("symlog", linthresh=1.0)
    cdf.set_xlabel("cell start delay, s")
    cdf.set_ylabel("fraction of cells")
    cdf.legend(loc="lower right")
    _trade_off(axes[-1], results)
    figure.tight_layout()
    figure.savefig(str(path), dpi=120)
    plt.close(figure)


def _thin(history: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """At most about `MAX_POINTS` points, keeping each bucket's maximum (peaks stay visible)."""
    if not history:
        return [], []
    start = history[0][0]
    step = max(1, len(history) // MAX_POINTS)
    times: list[float] = []
    values: list[float] = []
    for i in range(0, len(history), step):
        bucket = history[i : i + step]
        times.append((bucket[0][0] - start) / 3600)
        values.append(max(v for _, v in bucket))
    return times, values


def _trade_off(axis: Any, results: dict[str, PolicyResult]) -> None:
    """Provisioned GPU-hours against p95 start delay, one point per policy (in the legend), with the
    floor and the reservation baseline as vertical lines where known."""
    for name, result in results.items():
        p95 = result.start_delay()["p95"]
        axis.scatter([result.gpu_hours_provisioned], [p95], label=name)
    first = next(iter(results.values()), None)
    if first is not None and first.gpu_hours_floor > 0:
        axis.axvline(first.gpu_hours_floor, linestyle=":", color="grey", label="floor (busy)")
    if first is not None and first.gpu_hours_reservation is not None:
        axis.axvline(first.gpu_hours_reservation, linestyle="--", color="grey", label="reservation")
    axis.set_xlabel("provisioned GPU-hours")
    axis.set_ylabel("start delay p95, s")
    axis.set_title("cost against delay")
    axis.legend(loc="upper right")
