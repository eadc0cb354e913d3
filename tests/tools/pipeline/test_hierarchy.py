"""The hierarchical planner: one level is the flat planner; two levels against a brute force
that prices each level as the module docstring says (PipeDream's published code)."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.graphfile import graph_profile, parse_graph, read_graph_profile
from kernelfleet.tools.pipeline.hierarchy import plan_hierarchical
from kernelfleet.tools.pipeline.planner import plan_pipeline
from kernelfleet.tools.pipeline.profiles import LayerProfile, ModelProfile
from tests.tools.pipeline.test_graphfile import BRANCHING


def sync(parameters: float, replicas: int, bandwidth: float) -> float:
    return 4 * (replicas - 1) * parameters / (bandwidth * replicas)


def pipelines(
    profile: ModelProfile, first: int, last: int, workers: int
) -> list[list[tuple[int, int, int]]]:
    """Every pipeline of layers ``first..last`` on exactly ``workers`` workers, as
    ``[(first, last, replicas), ...]``: a stage ending at ``j`` may follow a split after ``k``
    (the segment's own start included) only when ``k`` is upstream of ``j``."""

    def tails(start: int, ends_after: int | None, left: int) -> list[list[tuple[int, int, int]]]:
        found = []
        for end in range(start, last + 1):
            if ends_after is not None and ends_after not in profile.splits[end]:
                continue
            for replicas in range(1, left + 1):
                if end == last and replicas == left:
                    found.append([(start, end, replicas)])
                elif end < last and replicas < left:
                    found += [
                        [(start, end, replicas), *rest]
                        for rest in tails(end + 1, end, left - replicas)
                    ]
        return found

    return tails(first, first - 1 if first > 0 else None, workers)


def brute_two_levels(
    profile: ModelProfile, inner: tuple[int, float], outer: tuple[int, float]
) -> float:
    (gpus, fast), (machines, slow) = inner, outer

    @functools.cache
    def on_one_machine(first: int, last: int) -> float:
        best = math.inf
        for stages in pipelines(profile, first, last, gpus):
            times = []
            for a, b, r in stages:
                cost = profile.stage(a, b)
                times.append((cost.compute_s + sync(cost.parameter_bytes, r, fast)) / r)
            best = min(best, max(times))
        return best

    best = math.inf
    for stages in pipelines(profile, 0, len(profile) - 1, machines):
        times = []
        for a, b, r in stages:
            spread = gpus if a == 0 else 1  # PipeDream divides only the first stage's sync
            params = profile.stage(a, b).parameter_bytes
            times.append((on_one_machine(a, b) + sync(params, r, slow) / spread) / r)
        best = min(best, max(times))
    return best


@pytest.mark.parametrize("model", ["vgg16", "alexnet", "resnet18"])
@pytest.mark.parametrize("workers", [1, 3, 4])
def test_one_level_is_the_flat_planner(
    pipedream_profile: Callable[[str], Path], model: str, workers: int
) -> None:
    profile = read_graph_profile(pipedream_profile(model))
    flat = plan_pipeline(profile, workers, 1.25e9)
    plan = plan_hierarchical(profile, [(workers, 1.25e9)])
    assert plan.as_document() == flat.as_document()
    assert plan.data_parallel_time_s == flat.data_parallel_time_s


@pytest.mark.parametrize(
    "levels",
    [
        ((2, 1e10), (2, 1.25e9)),
        ((2, 5e9), (3, 1e8)),
        ((3, 1e10), (2, 1.25e9)),
        ((2, 1e10), (3, 1e10)),  # the first machine-level stage on 2 machines
        ((2, 1e11), (4, 1e10)),
    ],
)
def test_two_levels_golden_by_brute_force(
    pipedream_profile: Callable[[str], Path], levels: tuple[tuple[int, float], ...]
) -> None:
    profile = read_graph_profile(pipedream_profile("alexnet"))
    plan = plan_hierarchical(profile, levels)
    assert plan.time_per_minibatch_s == pytest.approx(brute_two_levels(profile, *levels), rel=1e-12)
    assert sum(stage.replicas for stage in plan.stages) == levels[0][0] * levels[1][0]
    assert [s.first for s in plan.stages[1:]] == [s.last + 1 for s in plan.stages[:-1]]


@pytest.mark.parametrize("levels", [((2, 1e3), (2, 1e2)), ((3, 1e3), (2, 1e3))])
def test_two_levels_on_a_branching_graph(levels: tuple[tuple[int, float], ...]) -> None:
    profile = graph_profile(parse_graph(BRANCHING))
    plan = plan_hierarchical(profile, levels)
    assert plan.time_per_minibatch_s == pytest.approx(brute_two_levels(profile, *levels), rel=1e-12)


def test_vgg16_on_two_machines_of_four(pipedream_profile: Callable[[str], Path]) -> None:
    """What PipeDream's optimizer printed for ``-n 4 2 -b 1e10 1.25e9``: machine 0 runs layers
    0-7 on its 4 GPUs, machine 1 runs 8-17 on 2 GPUs, 18-21 and 22-39 on one each; 0.0928108
    s per minibatch, data parallelism 0.2155065 s (docs/pipeline.md)."""
    profile = read_graph_profile(pipedream_profile("vgg16"))
    plan = plan_hierarchical(profile, [(4, 1e10), (2, 1.25e9)])
    assert [(s.first, s.last, s.replicas) for s in plan.stages] == [
        (0, 7, 4), (8, 17, 2), (18, 21, 1), (22, 39, 1),
    ]  # fmt: skip
    assert plan.time_per_minibatch_s == pytest.approx(0.0928108, rel=1e-6)
    assert plan.data_parallel_time_s == pytest.approx(0.2155065, rel=1e-6)


@pytest.mark.parametrize(
    ("levels", "message"),
    [([], "at least one level"), ([(0, 1e9)], "at least 1 worker"), ([(2, -1.0)], "bandwidth")],
)
def test_bad_levels(levels: list[tuple[int, float]], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        plan_hierarchical(ModelProfile.chain([LayerProfile("a", "a", 0.01, 0.02, 1, 1)]), levels)


def test_segments_split_only_where_the_profile_allows() -> None:
    """Layer 1 cannot end a stage that follows a split after layer 0, inside a machine too."""
    layers = [LayerProfile(name, name, 0.01, 0.02, 0, 1e6) for name in "abc"]
    chain = ModelProfile.chain(layers)
    restricted = dataclasses.replace(chain, splits=(frozenset(), frozenset(), frozenset({0, 1})))
    levels = ((2, 1e8), (2, 1e8))
    expected = brute_two_levels(restricted, *levels)
    assert expected > brute_two_levels(chain, *levels)
    plan = plan_hierarchical(restricted, levels)
    assert plan.time_per_minibatch_s == pytest.approx(expected, rel=1e-12)
    assert (1, 1) not in [(s.first, s.last) for s in plan.stages]
