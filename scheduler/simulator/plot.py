"""``--plot``: provisioned vs busy GPUs over time per policy, and the start-delay CDFs."""

from __future__ import annotations

from pathlib import Path

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
    """Write a PNG with one time panel per policy and one CDF panel; matplotlib is optional."""
    require_matplotlib()
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(len(results) + 1, 1, figsize=(11, 3 * (len(results) + 1)))
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
    cdf = axes[-1]
    for name, result in results.items():
        delays = sorted(result.delays_s)
        if delays:
            fractions = [(i + 1) / len(delays) for i in range(len(delays))]
            cdf.step(delays, fractions, where="post", label=name)
    cdf.set_xscale("symlog", linthresh=1.0)
    cdf.set_xlabel("cell start delay, s")
    cdf.set_ylabel("fraction of cells")
    cdf.legend(loc="lower right")
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
