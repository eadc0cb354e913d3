"""``%energy`` in an in-process IPython shell: its arguments, the replay, measuring a cell, and
tuning a cell through the fake gateway and the fake pynvml; bad input as one-line errors."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from kernelfleet.kernels.magics.parsing import parse
from kernelfleet.tools.energy import magics
from kernelfleet.tools.energy.errors import NoGpuBound, SettingRefused, TraceNotFound, UnknownKnob
from kernelfleet.tools.energy.magics import EnergyMagics, duration, energy_parser
from kernelfleet.tools.energy.meter import EnergyMeter

from .conftest import FakeGateway, FakeNvml


@pytest.fixture
def shell(monkeypatch) -> InteractiveShell:
    for name in ("KERNELFLEET_GATEWAY_URL", "KERNELFLEET_KERNEL_TOKEN", "KERNELFLEET_KERNEL_ID"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("KERNELFLEET_GPUS", raising=False)
    config = Config()
    config.HistoryManager.enabled = False
    return InteractiveShell(config=config)


def with_fakes(shell, gpus, gateway=None):
    shell.register_magics(
        EnergyMagics(
            shell,
            client_factory=lambda: gateway,
            meter_factory=lambda: EnergyMeter([g.index for g in gpus], FakeNvml(gpus)),
        )
    )
    return shell


def test_the_entry_point_registers_the_magic(shell):
    magics.load(shell)
    assert "energy" in shell.magics_manager.magics["line"]
    assert "energy" in shell.magics_manager.magics["cell"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("50ms", 0.05), ("1.5s", 1.5), ("2min", 120.0), ("1h", 3600.0), ("250us", 2.5e-4), ("3", 3.0)],
)
def test_slos_take_units(text, seconds):
    assert duration(text) == pytest.approx(seconds)


def test_tune_reads_its_options():
    args = parse(energy_parser(), "tune --slo 50ms --knobs gpu_clock,batch --trials 12 "
                 "--batch 8,16 --batch-var bs --seed 3 --dry-run")  # fmt: skip
    assert (args.slo, args.knobs, args.trials) == (0.05, ["gpu_clock", "batch"], 12)
    assert (args.batch, args.batch_var, args.seed, args.dry_run) == ([8.0, 16.0], "bs", 3, True)
    assert parse(energy_parser(), "tune --slo 1h").batch_var == "batch_size"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("tune", "the following arguments are required: --slo"),
        ("tune --slo fast", "expected a time above 0"),
        ("tune --slo 0ms", "expected a time above 0"),
        ("tune --slo 1s --trials 0", "expected a whole number from 1 to 1000"),
        ("tune --slo 1s --batch 8,x", "expected numbers above 0"),
        ("tune --slo 1s --knobs batch", "the batch knob needs its values: --batch 8,16,32"),
        ("tune --slo 1s", "runs the cell's body as the workload"),
        ("measure", "nothing to measure"),
        ("calibrate", "invalid choice: 'calibrate'"),
    ],
)
def test_bad_arguments_raise_usage_errors(shell, line, message):
    with_fakes(shell, [])
    with pytest.raises(UsageError, match=message):
        shell.run_line_magic("energy", line)


def test_tune_on_the_replay_reports_the_best_setting_under_the_slo(shell, zeus_trace):
    with_fakes(shell, [])
    view = shell.run_line_magic(
        "energy", f"tune --replay v100:imagenet/resnet50 --slo 3871s --seed 0 --trials 12 "
        f"--trace {zeus_trace}"
    )  # fmt: skip
    text = repr(view)
    assert text.startswith("best under the SLO of 1.08 h: power_limit ")
    assert "less energy than the default" in text
    assert "the replay of v100:imagenet/resnet50/adadelta" in text
    assert "<table>" in view._repr_html_()


def test_the_replay_with_an_slo_nobody_meets_keeps_the_default(shell, zeus_trace):
    with_fakes(shell, [])
    view = shell.run_line_magic(
        "energy",
        f"tune --replay v100:imagenet/resnet50 --slo 50min --trace {zeus_trace} --trials 5",
    )
    assert repr(view).startswith("no setting met the SLO of 3000 s in 5 evaluations")
    assert "kept the default (power_limit 250 W, batch 360)" in repr(view)


def test_the_replays_bad_input_is_one_line(shell, zeus_trace, tmp_path):
    with_fakes(shell, [])
    with pytest.raises(UnknownKnob) as caught:
        shell.run_line_magic("energy", f"tune --replay v100:imagenet/resnet50 --slo 1h "
                             f"--knobs gpu_clock --trace {zeus_trace}")  # fmt: skip
    assert caught.value._render_traceback_() == [
        "UnknownKnob: the replay of v100:imagenet/resnet50/adadelta has no knob 'gpu_clock': "
        "it offers power_limit, batch"
    ]
    with pytest.raises(TraceNotFound, match=r"no summary_power_<gpu>\.csv in"):
        shell.run_line_magic("energy", f"tune --replay v100:x/y --slo 1h --trace {tmp_path}")


def test_measure_shows_energy_per_gpu(shell, gpus):
    with_fakes(shell, gpus)
    shell.user_ns["gpu"] = gpus[0]
    view = shell.run_cell_magic("energy", "measure", "gpu.run(0.02)\nx = 1\n")
    assert shell.user_ns["x"] == 1
    text = repr(view)
    assert text.startswith("took ")
    assert "on 2 GPUs" in text
    assert "NVML total-energy counters" in text
    assert "average power" in text


def test_measure_without_a_gpu_times_the_cell_and_says_why(shell):
    magics.load(shell)  # the real meter: KERNELFLEET_GPUS is not set here
    view = shell.run_line_magic("energy", "measure y = 2 ** 10")
    assert shell.user_ns["y"] == 1024
    assert "energy not measured: no GPU is bound to this cell" in repr(view)


def test_tune_runs_the_body_once_per_trial_and_leaves_the_chosen_batch(shell, gpus, capsys):
    gateway = FakeGateway(gpus)
    with_fakes(shell, gpus, gateway)
    shell.user_ns.update(gpu=gpus[0], batch_size=8, runs=[])
    body = "runs.append(batch_size)\ngpu.run(0.001 * batch_size / 8 + 0.003)\n"
    view = shell.run_cell_magic(
        "energy",
        "tune --slo 40ms --knobs power_limit,batch --batch 8,16,32 --trials 6 --seed 0",
        body,
    )
    runs = shell.user_ns["runs"]
    assert 1 <= len(runs) <= 6
    assert runs[0] == 8
    assert set(runs) <= {8, 16, 32}
    assert repr(view).startswith("best under the SLO of 40 ms")
    assert "per item" in repr(view)
    assert (
        f"batch_size = {shell.user_ns['batch_size']} (the chosen batch)" in capsys.readouterr().out
    )


def test_dry_run_prints_the_calls_the_host_would_make(shell, gpus):
    gateway = FakeGateway(gpus)
    with_fakes(shell, gpus, gateway)
    view = shell.run_cell_magic("energy", "tune --slo 50ms --knobs gpu_clock --dry-run", "1/0")
    text = repr(view)
    assert "search space of this cell's GPUs" in text
    assert "would measure at most 20" in text
    assert "nvmlDeviceSetGpuLockedClocks(0, 1980, 1980)" in text
    assert "nvmlDeviceSetGpuLockedClocks(1, 510, 510)" in text
    assert gateway.changes() == []


def test_reset_puts_the_defaults_back(shell, gpus, capsys):
    gateway = FakeGateway(gpus)
    with_fakes(shell, gpus, gateway)
    gpus[0].power_limit = 300.0
    shell.run_line_magic("energy", "reset")
    assert gateway.changes() == [("reset", {})]
    assert gpus[0].power_limit == 700.0
    assert "back to their default settings" in capsys.readouterr().out


def test_no_gpu_and_no_permission_are_one_line_errors_and_the_batch_is_restored(shell, gpus):
    with_fakes(shell, [], FakeGateway([]))
    with pytest.raises(NoGpuBound):
        shell.run_cell_magic("energy", "tune --slo 50ms", "pass")
    gateway = FakeGateway(gpus, refuse=(403, "permission-denied"))
    with_fakes(shell, gpus, gateway)
    shell.user_ns["batch_size"] = 16
    with pytest.raises(SettingRefused, match="nothing was changed"):
        shell.run_cell_magic("energy", "tune --slo 50ms --batch 8,16", "pass")
    assert shell.user_ns["batch_size"] == 16
    assert gateway.changes()[-1] == ("reset", {})
