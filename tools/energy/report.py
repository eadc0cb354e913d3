"""What ``%energy`` shows: a tuning run's result and a cell's measurement, as the magics' views
(`kernelfleet.kernels.magics.views.View`: HTML tables in JupyterLab, plain text elsewhere)."""

from __future__ import annotations

from typing import Any

from kernelfleet.kernels.magics.views import Section, View
from kernelfleet.tools.energy.backend import Measurement
from kernelfleet.tools.energy.knobs import describe
from kernelfleet.tools.energy.tuner import TuneResult


def duration(seconds: float) -> str:
    """A latency for people: ``48.2 ms``, ``3.52 s``, ``955 s``, ``1.02 h`` (three significant
    digits, whole seconds up to an hour)."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.3g} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3g} ms"
    if seconds < 100:
        return f"{seconds:.3g} s"
    if seconds < 3600:
        return f"{seconds:.0f} s"
    return f"{seconds / 3600:.3g} h"


def joules(value: float | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3), ("J", 1.0)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value * 1e3:.3g} mJ"


def summary_line(result: TuneResult) -> str:
    """One line: the setting chosen and what it saves, or that nothing met the SLO."""
    slo = duration(result.slo_s)
    if result.best is None:
        fastest = min(result.trials, key=lambda t: t.measurement.latency_s)
        return (
            f"no setting met the SLO of {slo} in {result.evaluations} evaluations (the fastest "
            f"took {duration(fastest.measurement.latency_s)}, at {describe(fastest.setting)}): "
            f"kept the default ({describe(result.default.setting)})"
        )
    best = result.best
    if best.number == 0:
        return (
            f"the default met the SLO of {slo} and nothing measured did better: "
            f"{describe(best.setting)} ({duration(best.measurement.latency_s)}, "
            f"{joules(best.measurement.energy_per_item_j)}), after {result.evaluations} "
            "evaluations"
        )
    saved = result.saved
    gain = "" if saved is None else f", {100 * saved:.1f} % less energy than the default"
    return (
        f"best under the SLO of {slo}: {describe(best.setting)} "
        f"({duration(best.measurement.latency_s)}, {joules(best.measurement.energy_per_item_j)}"
        f"{' per item' if best.measurement.items != 1 else ''}{gain}), "
        f"after {result.evaluations} evaluations"
    )


def tune_view(result: TuneResult) -> View:
    """The result of ``%energy tune``: the summary, then every evaluation in order."""
    per_item = any(t.measurement.items != 1 for t in result.trials)
    header = ("#", *result.space.names, "latency", "energy" + (" per item" if per_item else ""),
              "meets SLO", "")  # fmt: skip
    rows = []
    for trial in result.trials:
        mark = "best" if trial is result.best else ("default" if trial.number == 0 else "")
        rows.append(
            (
                str(trial.number),
                *(f"{trial.setting[name]:g}" for name in result.space.names),
                duration(trial.measurement.latency_s),
                joules(trial.measurement.energy_per_item_j),
                "yes" if trial.feasible else "no",
                mark,
            )
        )
    note = (
        f"{result.backend}: {result.evaluations} evaluations of a grid of {result.space.size}, "
        f"{result.seconds:.1f} s{'; the model converged' if result.converged else ''}"
    )
    return View(Section(result.summary, note, header, tuple(rows)))


def measure_view(measurement: Measurement, why: str | None) -> View:
    """The result of ``%energy measure``: time, and energy per GPU or why there is none."""
    title = f"took {duration(measurement.latency_s)}"
    if measurement.energy_j is None:
        return View(Section(f"{title}; energy not measured: {why or 'unknown reason'}"))
    title += f", used {joules(measurement.energy_j)} on {_gpus(len(measurement.per_gpu))}"
    rows = tuple(
        (str(g.index), joules(g.energy_j), _watts(g.energy_j, measurement.latency_s))
        for g in measurement.per_gpu
    )
    return View(
        Section(title, "NVML total-energy counters", ("GPU", "energy", "average power"), rows)
    )


def dry_run_view(space_text: str, devices: list[dict[str, Any]], label: str) -> Section:
    rows = tuple(
        (str(d.get("index", "?")), call) for d in devices for call in d.get("calls") or ["(none)"]
    )
    return Section(f"dry run, {label}", space_text, ("GPU", "NVML call"), rows)


def _watts(energy_j: float, seconds: float) -> str:
    return f"{energy_j / seconds:.3g} W" if seconds > 0 else "-"


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
