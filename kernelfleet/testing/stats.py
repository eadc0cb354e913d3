"""Summary figures of timing samples, as the benchmarks report them."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (`q` in 0-100) of `values`, in any order: the smallest sample
    that at least q % of the samples do not exceed. Raises ``ValueError`` if there is none.

    The simulator reports interpolated percentiles instead
    (`kernelfleet.scheduler.simulator.metrics.percentile`): its figures are its own.
    """
    if not values:
        raise ValueError("no samples")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]
