"""A factorisation plan as ``%pufferfish`` shows it: one row per candidate layer, then totals.

Pure functions over a `FactorizationPlan`, returning a `View` (HTML in JupyterLab, text
elsewhere).
"""

from __future__ import annotations

from kernelfleet.kernels.magics.views import Section, View
from kernelfleet.tools.pufferfish.factorize import FactorizationPlan, LayerChoice

HEADER = ("layer", "type", "weight shape", "rank", "params before", "params after")


def plan_view(plan: FactorizationPlan, title: str) -> View:
    """The table of `plan` under `title`, with totals and the all-reduce bytes per DDP step."""
    rows = tuple(_row(layer) for layer in plan.layers)
    if plan.other_params:
        rows += (
            ("(other parameters)", "", "", "", f"{plan.other_params:,}", f"{plan.other_params:,}"),
        )
    rows += (("total", "", "", "", f"{plan.params_before:,}", f"{plan.params_after:,}"),)
    return View(Section(title, summary(plan), HEADER, rows))


def summary(plan: FactorizationPlan) -> str:
    """One line: layers factorised, parameters and all-reduce bytes per step, before and after."""
    smaller = plan.bytes_before / plan.bytes_after if plan.bytes_after else float("inf")
    return (
        f"rank ratio {plan.ratio:g}: {len(plan.factorized)} of {len(plan.layers)} layers "
        f"factorised; parameters {plan.params_before:,} -> {plan.params_after:,}; all-reduce "
        f"per DDP step {_megabytes(plan.bytes_before)} -> {_megabytes(plan.bytes_after)} "
        f"({smaller:.2f}x less)"
    )


def _row(layer: LayerChoice) -> tuple[str, ...]:
    shape = " x ".join(str(size) for size in layer.shape)
    rank = f"{layer.rank} of {layer.full_rank}" if layer.rank is not None else layer.why_full
    return (
        layer.name or "(the model)",
        layer.kind,
        shape,
        rank,
        f"{layer.params_before:,}",
        f"{layer.params_after:,}",
    )


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.2f} MB"
