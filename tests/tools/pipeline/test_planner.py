"""PipeDream's partitioner: the published VGG16 figure, and golden plans from a brute force.

The brute force below knows nothing of the dynamic programme: it lists every way to cut the
layers into consecutive stages (only at allowed boundaries) and every way to share the workers
among them, prices each stage with the formulas of the planner's docstring, and keeps the
fastest. The planner must reach the same time per minibatch, with a plan the brute force
prices at that same time.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.graphfile import graph_profile, parse_graph, read_graph_profile
from kernelfleet.tools.pipeline.planner import CannotPartition, Plan, plan_pipeline
from kernelfleet.tools.pipeline.profiles import LayerProfile, ModelProfile
from tests.tools.pipeline.test_graphfile import BRANCHING

GBIT10 = 1.25e9


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` positive whole numbers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(b - a for a, b in itertools.pairwise(bounds))


def stage_time(
    profile: ModelProfile,
    first: int,
    last: int,
    replicas: int,
    workers_after: int,
    bandwidth: float,
    memory: float | None,
    compression: float | None,
) -> float:
    before = profile.through[first - 1] if first else None
    compute = profile.through[last].compute_s - (before.compute_s if before else 0.0)
    params = profile.through[last].parameter_bytes - (before.parameter_bytes if before else 0.0)
    held = profile.through[last].activation_bytes - (before.activation_bytes if before else 0.0)
    if (
        memory is not None
        and (held + params) * math.ceil((workers_after + replicas) / replicas) > memory
    ):
        return math.inf
    time_s = (compute + 4 * (replicas - 1) * params / (bandwidth * replicas)) / replicas
    if compression is not None and first > 0:
        moved = [profile.layers[first - 1].activation_bytes]
        if last < len(profile) - 1:
            moved.append(profile.layers[last].activation_bytes)
        time_s = max(time_s, *(2 * size / (bandwidth * replicas) / compression for size in moved))
    return time_s


def plan_time(
    profile: ModelProfile,
    stages: list[tuple[int, int, int]],
    bandwidth: float,
    memory: float | None = None,
    compression: float | None = None,
) -> float:
    """The time per minibatch of the pipeline ``[(first, last, replicas), ...]``."""
    workers_after = [sum(r for _, _, r in stages[i + 1 :]) for i in range(len(stages))]
    return max(
        stage_time(profile, f, last, r, after, bandwidth, memory, compression)
        for (f, last, r), after in zip(stages, workers_after, strict=True)
    )


def brute_force(
    profile: ModelProfile,
    workers: int,
    bandwidth: float,
    memory: float | None = None,
    compression: float | None = None,
) -> float:
    n, best = len(profile), math.inf
    for count in range(1, min(workers, n) + 1):
        for ends in itertools.combinations(range(n - 1), count - 1):
            bounds = (*ends, n - 1)
            if any(a not in profile.splits[b] for a, b in itertools.pairwise(bounds)):
                continue
            firsts = (0, *(end + 1 for end in ends))
            for replicas in compositions(workers, count):
                stages = list(zip(firsts, bounds, replicas, strict=True))
                best = min(best, plan_time(profile, stages, bandwidth, memory, compression))
    return best


def check_against_brute_force(
    profile: ModelProfile,
    workers: int,
    bandwidth: float,
    memory: float | None = None,
    compression: float | None = None,
) -> Plan | None:
    expected = brute_force(profile, workers, bandwidth, memory, compression)
    if math.isinf(expected):
        with pytest.raises(CannotPartition):
            plan_pipeline(profile, workers, bandwidth, memory_bytes=memory)
        return None
    plan = plan_pipeline(
        profile, workers, bandwidth, memory_bytes=memory, activation_compression=compression
    )
    stages = [(s.first, s.last, s.replicas) for s in plan.stages]
    assert plan.time_per_minibatch_s == pytest.approx(expected, rel=1e-12)
    assert plan_time(profile, stages, bandwidth, memory, compression) == pytest.approx(
        expected, rel=1e-12
    )
    assert stages[0][0] == 0
    assert stages[-1][1] == len(profile) - 1
    assert all(a[1] + 1 == b[0] for a, b in itertools.pairwise(stages))
    assert all(a[1] in profile.splits[b[1]] for a, b in itertools.pairwise(stages))
    assert sum(r for _, _, r in stages) == workers
    return plan


def test_vgg16_on_four_workers_matches_pipedream(pipedream_profile: Callable[[str], Path]) -> None:
    """PipeDream's optimizer on this profile prints the split ``(0, 15) x3, (15, 40) x1``:
    half-open ranges, so layers 0-14 on 3 replicas and 15-39 on one; 2.87x over 4-way data
    parallelism, 3.85x over one GPU, 0.174498 s per minibatch (../shared/data/README.md)."""
    plan = plan_pipeline(read_graph_profile(pipedream_profile("vgg16")), 4, GBIT10)
    assert plan.as_document()["stages"] == [
        {"layers": [0, 14], "replicas": 3},
        {"layers": [15, 39], "replicas": 1},
    ]
    assert plan.speedup_vs_data_parallel == pytest.approx(2.87, rel=0.05)
    assert plan.speedup_vs_one_worker == pytest.approx(3.85, rel=0.05)
    assert round(plan.speedup_vs_data_parallel, 2) == 2.87
    assert round(plan.speedup_vs_one_worker, 2) == 3.85
    assert plan.time_per_minibatch_s == pytest.approx(0.1744985, rel=1e-6)


@pytest.mark.parametrize("workers", [2, 3, 4, 6])
@pytest.mark.parametrize("bandwidth", [GBIT10, 1e8])
def test_alexnet_golden_by_brute_force(
    pipedream_profile: Callable[[str], Path], workers: int, bandwidth: float
) -> None:
    profile = read_graph_profile(pipedream_profile("alexnet"))
    assert profile.is_chain()
    assert len(profile) == 22
    check_against_brute_force(profile, workers, bandwidth)


@pytest.mark.parametrize("workers", [2, 3, 4])
@pytest.mark.parametrize("bandwidth", [GBIT10, 1e8])
def test_resnet18_golden_by_brute_force(
    pipedream_profile: Callable[[str], Path], workers: int, bandwidth: float
) -> None:
    """A graph with skip connections: stages may only end at states reachable from the last."""
    profile = read_graph_profile(pipedream_profile("resnet18"))
    assert not profile.is_chain()
    assert len(profile) == 100
    check_against_brute_force(profile, workers, bandwidth)


@pytest.mark.parametrize(
    ("fraction", "outcome"),
    [(0.1, "a layer too big"), (0.5, "too much in flight"), (1.0, "slower"), (2.0, "as fast")],
)
def test_memory_limit_golden_by_brute_force(
    pipedream_profile: Callable[[str], Path], fraction: float, outcome: str
) -> None:
    """Limits as fractions of what the whole model holds for one minibatch."""
    profile = read_graph_profile(pipedream_profile("alexnet"))
    limit = fraction * (profile.total.activation_bytes + profile.total.parameter_bytes)
    if outcome == "a layer too big":
        with pytest.raises(CannotPartition, match=r"layer 0 \(node2, Conv2d"):
            plan_pipeline(profile, 4, GBIT10, memory_bytes=limit)
    if outcome == "too much in flight":
        with pytest.raises(CannotPartition, match="too many minibatches"):
            plan_pipeline(profile, 4, GBIT10, memory_bytes=limit)
    plan = check_against_brute_force(profile, 4, GBIT10, memory=limit)
    assert (plan is None) == outcome.startswith(("a layer", "too much"))
    if plan is not None:
        assert all(stage.memory_bytes <= limit for stage in plan.stages)
        free = plan_pipeline(profile, 4, GBIT10).time_per_minibatch_s
        assert (plan.time_per_minibatch_s > free * 1.01) == (outcome == "slower")


def test_a_graph_with_several_inputs_golden_by_brute_force(
    pipedream_profile: Callable[[str], Path],
) -> None:
    """GNMT: several sources (inputs, and ops that read no tensor) and operators of 4 inputs."""
    profile = read_graph_profile(pipedream_profile("gnmt"))
    assert not profile.is_chain()
    check_against_brute_force(profile, 3, GBIT10)


@pytest.mark.parametrize("compression", [1.0, 10.0])
def test_counted_activations_golden_by_brute_force(
    pipedream_profile: Callable[[str], Path], compression: float
) -> None:
    profile = read_graph_profile(pipedream_profile("alexnet"))
    check_against_brute_force(profile, 4, 1e9, compression=compression)


def layer(
    name: str, compute_ms: float, activation: float = 1e6, params: float = 1e6
) -> LayerProfile:
    return LayerProfile(name, name, compute_ms / 3e3, 2 * compute_ms / 3e3, activation, params)


def test_more_workers_than_layers_replicates_stages() -> None:
    profile = ModelProfile.chain([layer("a", 10), layer("b", 40), layer("c", 20)])
    plan = check_against_brute_force(profile, 8, GBIT10)
    assert plan is not None
    assert len(plan.stages) <= 3
    assert sum(stage.replicas for stage in plan.stages) == 8


def test_one_worker_is_the_whole_model() -> None:
    profile = ModelProfile.chain([layer("a", 10), layer("b", 40)])
    plan = plan_pipeline(profile, 1, GBIT10)
    assert [(s.first, s.last, s.replicas) for s in plan.stages] == [(0, 1, 1)]
    assert plan.speedup_vs_one_worker == pytest.approx(1.0)
    assert plan.speedup_vs_data_parallel == pytest.approx(1.0)


def test_one_layer_over_the_memory_limit_cannot_be_split() -> None:
    profile = ModelProfile.chain(
        [layer("conv", 10), layer("huge", 10, params=5e9), layer("fc", 10)]
    )
    with pytest.raises(CannotPartition, match=r"layer 1 \(huge, huge\) alone holds 5\.001e\+09"):
        plan_pipeline(profile, 4, GBIT10, memory_bytes=1e9)
    plan = plan_pipeline(profile, 4, GBIT10, memory_bytes=6e9)
    assert all(stage.memory_bytes <= 6e9 for stage in plan.stages)


def test_no_split_fits_when_too_much_stays_in_flight() -> None:
    profile = ModelProfile.chain([layer("a", 10, activation=3e8, params=0)] * 4)
    with pytest.raises(CannotPartition, match="too many minibatches"):
        plan_pipeline(profile, 4, GBIT10, memory_bytes=5e8)


@pytest.mark.parametrize(
    ("workers", "bandwidth", "options", "message"),
    [
        (0, GBIT10, {}, "workers must be at least 1"),
        (2, 0.0, {}, "bandwidth must be a positive"),
        (2, math.inf, {}, "bandwidth must be a positive"),
        (2, GBIT10, {"memory_bytes": -1.0}, "memory limit must be positive"),
        (2, GBIT10, {"activation_compression": 0.0}, "compression ratio must be positive"),
    ],
)
def test_impossible_arguments(
    workers: int, bandwidth: float, options: dict[str, float], message: str
) -> None:
    profile = ModelProfile.chain([layer("a", 10)])
    with pytest.raises(InvalidRequest, match=message):
        plan_pipeline(profile, workers, bandwidth, **options)  # type: ignore[arg-type]


def test_a_plan_is_frozen() -> None:
    plan = plan_pipeline(ModelProfile.chain([layer("a", 10), layer("b", 10)]), 2, GBIT10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.workers = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.stages[0].replicas = 2  # type: ignore[misc]


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_branching_graph_splits_only_at_cuts(workers: int) -> None:
    """In the branching graph's order (a, c1, b1, b2, ...), a stage cannot run b1..b2 after a
    stage ending at c1: the prefix sums would give it a negative cost, which a planner ignoring
    the cuts would happily pick."""
    profile = graph_profile(parse_graph(BRANCHING))
    assert 1 not in profile.splits[3]
    assert profile.stage(2, 3).compute_s < 0  # through[3] - through[1]: not a real stage
    check_against_brute_force(profile, workers, 1e3)


def test_stages_split_only_where_the_profile_allows() -> None:
    """Three equal layers on three workers: one layer per worker would be fastest, but a stage
    ending at layer 1 may not follow a split after layer 0 (as a graph's cuts can forbid), so
    the pipeline must replicate a stage and pay to synchronise it."""
    layers = [layer(name, 30, activation=0, params=1e6) for name in "abc"]
    chain = ModelProfile.chain(layers)
    restricted = dataclasses.replace(chain, splits=(frozenset(), frozenset(), frozenset({0, 1})))
    assert [(s.first, s.last) for s in plan_pipeline(chain, 3, 1e8).stages][1] == (1, 1)
    plan = check_against_brute_force(restricted, 3, 1e8)
    assert plan is not None
    assert all((stage.first, stage.last) != (1, 1) for stage in plan.stages)
    assert plan.time_per_minibatch_s > plan_pipeline(chain, 3, 1e8).time_per_minibatch_s


def test_a_graph_that_fits_nowhere_says_so(pipedream_profile: Callable[[str], Path]) -> None:
    profile = read_graph_profile(pipedream_profile("resnet18"))
    with pytest.raises(CannotPartition, match="no split at the graph's cuts fits"):
        plan_pipeline(profile, 4, GBIT10, memory_bytes=1e6)
