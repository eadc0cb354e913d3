"""The tuner: PolyThrottle's constrained BO never reports an SLO-violating setting, keeps the
default when nothing meets the SLO, resets on failure, and comes within 5 % of the grid
optimum on Zeus's tables in at most 20 evaluations."""

from __future__ import annotations

import pytest

from kernelfleet.tools.energy.backend import Measurement
from kernelfleet.tools.energy.errors import EnergyError, UnknownKnob
from kernelfleet.tools.energy.knobs import Knob, SearchSpace, Setting, select
from kernelfleet.tools.energy.replay import ReplayBackend
from kernelfleet.tools.energy.tuner import tune


class BowlBackend:
    """A deterministic backend over a closed form: a slower setting saves energy, down to a
    bowl's bottom at the lowest clock; it records what stays applied."""

    name = "the bowl"
    deterministic = True

    def __init__(self, fail_at: int | None = None) -> None:
        self.knobs = [
            Knob("gpu_clock", tuple(float(c) for c in range(600, 2001, 100)), 2000.0),
            Knob("batch", (1.0, 2.0, 4.0, 8.0, 16.0, 32.0), 32.0),
        ]
        self.applied: dict[str, float] | None = None
        self.resets = 0
        self.measured: list[dict[str, float]] = []
        self.fail_at = fail_at

    def space(self, knobs=None) -> SearchSpace:
        return select(self.knobs, knobs, self.name)

    def measure(self, setting: Setting) -> Measurement:
        if self.fail_at is not None and len(self.measured) == self.fail_at:
            raise EnergyError("the workload crashed")
        self.measured.append(dict(setting))
        clock, batch = setting.get("gpu_clock", 2000.0), setting.get("batch", 32.0)
        latency = (1 + 32 / batch) * 2000 / clock
        power = 50 + 250 * (clock / 2000) ** 3
        return Measurement(latency_s=latency, energy_j=latency * power)

    def apply(self, setting: Setting) -> None:
        self.applied = dict(setting)

    def reset(self) -> None:
        self.applied = None
        self.resets += 1

    def grid_optimum(self, slo: float) -> float:
        feasible = [self.measure(s) for s in self.space().grid()]
        self.measured.clear()
        return min(m.energy_j for m in feasible if m.latency_s <= slo)


def test_the_best_meets_the_slo_and_stays_applied():
    backend = BowlBackend()
    result = tune(backend, slo_s=3.0, seed=0)
    assert result.best is not None
    assert result.best.measurement.latency_s <= 3.0
    assert all(t.feasible == (t.measurement.latency_s <= 3.0) for t in result.trials)
    assert result.best.measurement.energy_j == min(
        t.measurement.energy_j for t in result.trials if t.feasible
    )
    assert backend.applied == result.best.setting == result.applied
    assert result.trials[0].setting == {"gpu_clock": 2000.0, "batch": 32.0}  # the default first
    assert len(backend.measured) == result.evaluations <= 20
    assert len({tuple(s.items()) for s in backend.measured}) == len(backend.measured)
    assert result.saved is not None
    assert result.saved > 0
    assert "less energy than the default" in result.summary


def test_an_slo_nothing_meets_keeps_the_default_and_says_so():
    backend = BowlBackend()
    backend.applied = {"gpu_clock": 900.0}
    result = tune(backend, slo_s=0.5, seed=0, evaluations=8)
    assert result.best is None
    assert result.saved is None
    assert result.applied == {}
    assert backend.applied is None
    assert backend.resets == 1
    assert result.summary.startswith("no setting met the SLO of 500 ms in 8 evaluations")
    assert result.summary.endswith("kept the default (gpu_clock 2000 MHz, batch 32)")


def test_a_failing_measurement_resets_and_propagates():
    backend = BowlBackend(fail_at=3)
    with pytest.raises(EnergyError, match="crashed"):
        tune(backend, slo_s=3.0, seed=0)
    assert backend.resets == 1
    assert backend.applied is None


def test_bad_arguments_are_refused_before_anything_runs():
    backend = BowlBackend()
    with pytest.raises(UnknownKnob, match="has no knob 'mem_clock': it offers gpu_clock, batch"):
        tune(backend, slo_s=1.0, knobs=["mem_clock"])
    for slo in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive time"):
            tune(backend, slo_s=slo)
    with pytest.raises(ValueError, match="evaluation"):
        tune(backend, slo_s=1.0, evaluations=0)
    assert backend.measured == []


def test_a_default_nothing_beats_is_said_so():
    backend = BowlBackend()
    result = tune(backend, slo_s=2.0, knobs=["batch"], seed=0)  # only the default is as fast
    assert result.best is result.trials[0]
    assert result.saved == 0
    assert result.summary.startswith("the default met the SLO of 2 s and nothing measured did")


def test_a_small_space_is_measured_at_most_once_per_setting():
    backend = BowlBackend()
    result = tune(backend, slo_s=10.0, knobs=["batch"], seed=0)
    assert result.evaluations <= 6 == result.space.size
    assert len({tuple(s.items()) for s in backend.measured}) == len(backend.measured)


@pytest.mark.slow
def test_the_bowls_optimum_is_found_within_5_percent():
    backend = BowlBackend()
    for slo in (2.5, 4.0):
        result = tune(backend, slo_s=slo, seed=0)
        assert result.best is not None
        assert result.best.measurement.energy_j <= 1.05 * backend.grid_optimum(slo)


ZEUS_TABLES = [
    "v100:imagenet/resnet50",
    "a40:librispeech/deepspeech2",
    "p100:squad/bert_base_uncased",
    "rtx6000:cifar100/shufflenetv2",
]


@pytest.mark.slow
@pytest.mark.parametrize("table", ZEUS_TABLES)
def test_zeus_tables_within_5_percent_of_the_grid_optimum_in_20_evaluations(zeus_trace, table):
    """The acceptance on the replay: at an SLO 10 % above the default's epoch time (and at the
    default's own), within 5 % of the grid's optimum, never reporting a violating setting.
    benchmarks/energy_tuner.py runs every table, SLO and several seeds."""
    backend = ReplayBackend.from_spec(table, zeus_trace)
    space = backend.space()
    default = backend.measure(space.default())
    grid = [backend.measure(s) for s in space.grid() if backend.covers(s)]
    for slo in (default.latency_s, 1.1 * default.latency_s):
        optimum = min(m.energy_j for m in grid if m.latency_s <= slo)
        result = tune(backend, slo, evaluations=20, seed=0)
        assert result.evaluations <= 20
        assert result.best is not None
        assert result.best.measurement.latency_s <= slo
        assert result.best.measurement.energy_j <= 1.05 * optimum, result.summary


def test_optuna_stays_quiet_during_a_run_and_keeps_its_level(capsys):
    import optuna

    optuna.logging.set_verbosity(optuna.logging.INFO)
    tune(BowlBackend(), slo_s=3.0, knobs=["batch"], evaluations=3, seed=0)
    assert optuna.logging.get_verbosity() == optuna.logging.INFO
    assert "Trial" not in capsys.readouterr().err
