"""The tuner: PolyThrottle's constrained Bayesian optimisation of energy under a latency SLO.

PolyThrottle (Yan, Wang, Venkataraman, MLSys'24, arXiv 2310.19991) minimises the energy of a
workload over hardware settings subject to a latency SLO. Its search has two phases: knobs
that act on their own part of the run only (the CPU frequency, which shapes preprocessing) are
tuned apart first; the knobs whose effects on latency interact (GPU clock, memory clock, batch
size) are then searched jointly by constrained Bayesian optimisation, since the latency
surface over them is noisy and hard to predict. kernelfleet's host agent offers no decoupled
knob (it sets GPU clock, memory clock and power limit; the batch is the workload's), so every
knob goes to the second phase. Its first evaluation is the default setting: the baseline the
savings are told against, and the quickest proof that the SLO can be met at all.

The search is optuna's `GPSampler` (a Gaussian process over each observed figure, log expected
improvement weighted by the probability of meeting the constraint). The SLO enters as the
constraint ``latency / slo - 1 <= 0`` (``Trial.set_constraint``, which optuna 5 reads in place
of the deprecated ``constraints_func``); the objective is the log of the energy per item.
The knobs are searched by value position (`kernelfleet.tools.energy.knobs`).

Guarantees: the best setting is the least energy among the settings *measured* to meet the
SLO; a setting that missed it is never reported as best. When none met it, the result says so
and the backend is reset to its defaults. A setting proposed twice is measured once (the
figures are reused and told to the model again, costing no measurement; only a backend that
is not `deterministic` is measured again). The run ends after ``evaluations`` measurements, when
the whole grid was measured, or after `PROPOSALS_PER_EVALUATION` proposals per evaluation.
(An earlier rule stopped after 3 repeated proposals in a row; on the Zeus tables it ended 2 of
the 11 runs that missed the 5 % mark with budget left, where the full budget reached the
optimum: docs/energy.md.)
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from kernelfleet.tools.energy.backend import EnergyBackend, Measurement
from kernelfleet.tools.energy.errors import EnergyError, SettingUnavailable
from kernelfleet.tools.energy.knobs import SearchSpace

log = logging.getLogger("kernelfleet.tools.energy")

DEFAULT_EVALUATIONS = 20
STARTUP_EVALUATIONS = 5
"""Random settings measured (after the default) before the Gaussian process proposes: a
handful per knob of a two- or three-knob space, leaving most of a 20-evaluation budget to the
model."""

PROPOSALS_PER_EVALUATION = 5
"""A bound on proposals (repeats and unavailable settings included) per evaluation: a run whose
model keeps proposing settings it has measured ends there, its budget unspent."""


@dataclass(frozen=True)
class Trial:
    """One measured setting: its `number` in measurement order, the `setting` and what it
    cost, and whether it met the SLO."""

    number: int
    setting: dict[str, float]
    measurement: Measurement
    feasible: bool


@dataclass(frozen=True)
class TuneResult:
    """What a tuning run found.

    ``best`` is the measured setting of least energy per item that met the SLO, None when no
    measured setting met it (``default`` then stays in place). ``trials`` are every
    measurement, in order; the first is the default setting. ``proposals`` counts the
    sampler's proposals (repeats included); ``converged`` is True when the run ended before its
    budget because the model kept proposing settings it had measured."""

    backend: str
    slo_s: float
    space: SearchSpace
    default: Trial
    trials: tuple[Trial, ...]
    best: Trial | None
    proposals: int
    converged: bool
    seconds: float
    applied: dict[str, float] = field(default_factory=dict)

    @property
    def evaluations(self) -> int:
        return len(self.trials)

    @property
    def saved(self) -> float | None:
        """The fraction of the default's energy per item the best setting saves (None when
        nothing met the SLO, or energy was not measured)."""
        if self.best is None:
            return None
        best = self.best.measurement.energy_per_item_j
        base = self.default.measurement.energy_per_item_j
        if best is None or not base:
            return None
        return 1 - best / base

    @property
    def summary(self) -> str:
        """One line: what was chosen and what it saves, or that nothing met the SLO."""
        from kernelfleet.tools.energy.report import summary_line

        return summary_line(self)


def tune(
    backend: EnergyBackend,
    slo_s: float,
    *,
    knobs: Sequence[str] | None = None,
    evaluations: int = DEFAULT_EVALUATIONS,
    seed: int | None = None,
    startup: int = STARTUP_EVALUATIONS,
) -> TuneResult:
    """Search `backend`'s `knobs` (all it offers when None) for the least energy per item
    whose latency stays within `slo_s` seconds, in at most `evaluations` measurements.

    Leaves the best setting applied on the backend, or resets it when none met the SLO or a
    measurement raised (the error then propagates). Raises `UnknownKnob` for a knob the
    backend lacks and ValueError for an SLO or budget that is not positive."""
    if not slo_s > 0 or math.isinf(slo_s):
        raise ValueError(f"the SLO must be a positive time, not {slo_s!r}")
    if evaluations < 1:
        raise ValueError("at least one evaluation is needed")
    space = backend.space(knobs)
    started = time.monotonic()
    with _optuna_quiet():
        search = _Search(backend, space, slo_s, evaluations, seed, startup)
        try:
            search.run()
        except BaseException:
            _reset_quietly(backend)
            raise
    best = min(
        (t for t in search.trials if t.feasible),
        key=lambda t: _energy(t.measurement),
        default=None,
    )
    if best is None:
        backend.reset()
        applied: dict[str, float] = {}
    else:
        backend.apply(best.setting)
        applied = dict(best.setting)
    return TuneResult(
        backend=backend.name,
        slo_s=slo_s,
        space=space,
        default=search.trials[0],
        trials=tuple(search.trials),
        best=best,
        proposals=search.proposals,
        converged=search.converged,
        seconds=time.monotonic() - started,
        applied=applied,
    )


@contextlib.contextmanager
def _optuna_quiet() -> Iterator[None]:
    """optuna's INFO lines (a study created, each trial told) silenced meanwhile; its level as
    the caller had it afterwards."""
    with warnings.catch_warnings():
        # optuna imports tqdm.auto, which warns in a kernel without ipywidgets; no bars here
        warnings.filterwarnings("ignore", message="IProgress not found")
        import optuna

    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def _reset_quietly(backend: EnergyBackend) -> None:
    """Reset after a failed run; a reset that fails too is logged, the first error wins (the
    host agent resets the devices anyway when the cell's GPUs are released)."""
    try:
        backend.reset()
    except Exception:
        log.warning("%s: the reset after a failed tuning run failed", backend.name, exc_info=True)


def _energy(measurement: Measurement) -> float:
    """The objective: energy per item; a run whose energy is unknown ranks by time alone."""
    energy = measurement.energy_per_item_j
    return measurement.latency_s if energy is None else energy


class _Search:
    """One run of the constrained BO loop over an optuna study (ask and tell)."""

    def __init__(
        self,
        backend: EnergyBackend,
        space: SearchSpace,
        slo_s: float,
        evaluations: int,
        seed: int | None,
        startup: int,
    ) -> None:
        import optuna

        self.optuna = optuna
        self.backend = backend
        self.space = space
        self.slo_s = slo_s
        self.budget = min(evaluations, space.size)
        self.trials: list[Trial] = []
        self.proposals = 0
        self.converged = False
        self._measured: dict[tuple[int, ...], Trial] = {}
        self.unavailable: set[tuple[int, ...]] = set()
        with warnings.catch_warnings():
            # deterministic_objective is marked experimental in optuna 5; it only tells the
            # Gaussian process to assume no observation noise
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.GPSampler(
                seed=seed,
                n_startup_trials=1 + startup,
                deterministic_objective=backend.deterministic,
                warn_independent_sampling=False,
            )
        self.study = optuna.create_study(direction="minimize", sampler=sampler)
        self.study.enqueue_trial(self._params(space.positions(space.default())))

    def run(self) -> None:
        limit = self.budget * PROPOSALS_PER_EVALUATION
        while len(self.trials) < self.budget:
            if self.proposals >= limit:
                self.converged = True
                break
            self.proposals += 1
            trial = self.study.ask()
            positions = tuple(
                trial.suggest_int(knob.name, 0, len(knob.values) - 1) for knob in self.space.knobs
            )
            done = self._measured.get(positions)
            if positions in self.unavailable:
                self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
                continue
            if done is None or not self.backend.deterministic:
                try:
                    done = self._measure(positions)
                except SettingUnavailable:
                    if not self.trials:
                        raise  # the default itself cannot run: nothing to compare against
                    self.unavailable.add(positions)
                    self.study.tell(trial, state=self.optuna.trial.TrialState.FAIL)
                    continue
            trial.set_constraint("slo", done.measurement.latency_s / self.slo_s - 1)
            self.study.tell(trial, _objective(done.measurement))

    def _measure(self, positions: tuple[int, ...]) -> Trial:
        setting = self.space.setting(positions)
        measurement = self.backend.measure(setting)
        if not math.isfinite(measurement.latency_s) or measurement.latency_s < 0:
            raise EnergyError(f"{self.backend.name} measured a latency of {measurement.latency_s}")
        feasible = measurement.latency_s <= self.slo_s
        done = Trial(len(self.trials), setting, measurement, feasible)
        self.trials.append(done)
        self._measured[positions] = done
        return done

    def _params(self, positions: tuple[int, ...]) -> dict[str, int]:
        return {k.name: p for k, p in zip(self.space.knobs, positions, strict=True)}


def _objective(measurement: Measurement) -> float:
    """What the Gaussian process models: the log of the energy per item (energy spans orders
    of magnitude over batch sizes; its log is smoother)."""
    return math.log(max(_energy(measurement), 1e-12))
