"""A plan for people: a table of its stages and a small diagram of the pipeline."""

from __future__ import annotations

from kernelfleet.tools.pipeline.planner import Plan
from kernelfleet.tools.pipeline.profiles import ModelProfile

BAR = 24


def plan_table(plan: Plan, profile: ModelProfile | None = None) -> str:
    """One line per stage (layers, replicas, per-minibatch times in ms), then the predictions.

    ``compute`` is one worker's forward plus backward time, ``sync`` the replicas' weight
    synchronisation, ``send`` the activation transfer (0 unless activations are counted), and
    ``stage`` the stage's time per minibatch: (compute + sync) / replicas, or send if longer.
    """
    header = (
        f"{'stage':>5}  {'layers':<11}{'replicas':>8}{'compute ms':>12}{'sync ms':>9}"
        f"{'send ms':>9}{'stage ms':>10}  first layer .. last layer"
    )
    lines = [header, "-" * len(header)]
    for number, stage in enumerate(plan.stages):
        names = ""
        if profile is not None:
            first, last = profile.layers[stage.first], profile.layers[stage.last]
            names = f"{_short(first.description)} .. {_short(last.description)}"
        lines.append(
            f"{number:>5}  {f'{stage.first}-{stage.last}':<11}{stage.replicas:>8}"
            f"{stage.compute_s * 1e3:>12.2f}{stage.sync_s * 1e3:>9.2f}"
            f"{stage.transfer_s * 1e3:>9.2f}{stage.time_s * 1e3:>10.2f}  {names}"
        )
    where = f"{plan.workers} workers at {plan.bandwidth:.4g} B/s"
    if plan.levels:
        where = " x ".join(f"{count} at {bandwidth:.4g} B/s" for count, bandwidth in plan.levels)
        where = f"{plan.workers} workers ({where}, innermost first)"
        lines.append("(hierarchical: sync is paid level by level; stage ms shows compute only)")
    lines += [
        "",
        f"time per minibatch {plan.time_per_minibatch_s * 1e3:.2f} ms on {where}",
        f"speed-up {plan.speedup_vs_data_parallel:.2f}x over {plan.workers}-way data parallelism "
        f"({plan.data_parallel_time_s * 1e3:.2f} ms), {plan.speedup_vs_one_worker:.2f}x over one "
        f"worker ({plan.one_worker_time_s * 1e3:.2f} ms)",
    ]
    return "\n".join(lines)


def plan_diagram(plan: Plan) -> str:
    """The stages left to right, their workers, and a bar of each stage's time per minibatch.

    The longest bar is the bottleneck: it sets the pipeline's pace.
    """
    slowest = max(stage.time_s for stage in plan.stages) or 1.0
    lines = []
    worker = 0
    for number, stage in enumerate(plan.stages):
        last = worker + stage.replicas - 1
        workers = f"w{worker}" if last == worker else f"w{worker}-w{last}"
        worker += stage.replicas
        filled = max(1, round(BAR * stage.time_s / slowest))
        arrow = "  |" if number < len(plan.stages) - 1 else ""
        lines.append(
            f"[stage {number}: layers {stage.first}-{stage.last} on {workers}] "
            f"{'#' * filled}{'.' * (BAR - filled)} {stage.time_s * 1e3:.1f} ms"
        )
        if arrow:
            lines.append("      v  activations forward, gradients back")
    return "\n".join(lines)


def _short(text: str, width: int = 28) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
