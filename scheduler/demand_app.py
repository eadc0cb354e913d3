"""``kernelfleet demand train``: train the autoscaler's demand model on a trace's first part,
score it on the rest, and write the model file.

    kernelfleet demand train --trace FILE [--first-days 7 | --until MINUTE] --out model.json \
        [--gpus-per-host 8] [--horizon 600] [--quantile 0.9]

``--until`` is on the trace's clock (minutes, as its submit_time column). Needs scikit-learn
(the ``tools`` extra); loading and using the file does not.
"""

from __future__ import annotations

import sys

from traitlets import Float, Int, Unicode
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import InvalidRequest
from kernelfleet.scheduler.trace import TRACE_HELP, read_trace


class DemandTrainApp(Application):
    """Train a demand model and write it."""

    name = "kernelfleet-demand-train"
    version = __version__
    description = (
        "Train the demand model on a trace's first days, score it on the rest against a "
        "moving average, and write it as JSON for --SimulateApp.demand_model and "
        "--GatewayApp.autoscale_demand_model."
    )
    aliases = {
        "trace": "DemandTrainApp.trace",
        "out": "DemandTrainApp.out",
        "first-days": "DemandTrainApp.first_days",
        "until": "DemandTrainApp.until",
        "gpus-per-host": "DemandTrainApp.gpus_per_host",
        "horizon": "DemandTrainApp.horizon_s",
        "quantile": "DemandTrainApp.quantile",
    }

    trace = Unicode("", config=True, help=TRACE_HELP)
    out = Unicode("", config=True, help="Write the model to this file (.json).")
    first_days = Float(7.0, config=True, help="Train on the days after the first submit.")
    until = Float(
        -1.0, config=True, help="Train on the steps before this trace minute (overrides days)."
    )
    gpus_per_host = Int(8, config=True, help="GPUs of the hosts the autoscaler adds.")
    horizon_s = Float(600.0, config=True, help="Predict the peak busy GPUs this far ahead (s).")
    quantile = Float(0.9, config=True, help="Margin: this quantile of held-out residuals.")
    step_s = Float(60.0, config=True, help="Step of the series (s).")
    window = Int(10, config=True, help="Steps of history the features cover.")
    trees = Int(40, config=True, help="Trees in the random forest.")

    def start(self) -> None:
        try:
            self._run()
        except InvalidRequest as error:
            print(f"kernelfleet demand train: {error.message}", file=sys.stderr)
            self.exit(2)

    def _run(self) -> None:
        from kernelfleet.scheduler.demand_train import train

        if not self.trace or not self.out:
            raise InvalidRequest("give the trace and the output file: --trace FILE --out M.json")
        if not self.out.endswith(".json"):
            raise InvalidRequest(
                f"--out {self.out}: the model is written as JSON (.json); skops is not a "
                "dependency of kernelfleet"
            )
        if not self.first_days > 0 and self.until < 0:
            raise InvalidRequest(f"--first-days must be > 0, not {self.first_days}")
        model, scores = train(
            read_trace(self.trace),
            until_min=self.until if self.until >= 0 else None,
            first_days=self.first_days,
            step_s=self.step_s,
            window=self.window,
            horizon_s=self.horizon_s,
            quantile=self.quantile,
            gpus_per_host=self.gpus_per_host,
            trees=self.trees,
        )
        model.save(self.out)
        trained = model.trained
        print(
            f"trained on {trained['steps']:,} steps of {model.step_s:g} s (trace minutes "
            f"{trained['from_s'] / 60:g} to {trained['until_s'] / 60:g}); margin "
            f"{model.margin_gpus:.1f} GPUs (quantile {model.quantile:g} of "
            f"{trained['held_out_for_margin']:,} held-out steps)"
        )
        if scores is None:
            print("no step left after the training span to score the model on")
        else:
            print(
                f"peak busy GPUs {model.horizon_s:g} s ahead on {scores.steps:,} later steps "
                f"(mean {scores.mean_peak:.1f}): forest MAE {scores.forest_mae:.2f}, moving "
                f"average MAE {scores.baseline_mae:.2f}, busy-now MAE "
                f"{scores.persistence_mae:.2f}; covered with the margin {scores.covered:.0%}"
            )
        print(f"model written to {self.out}")


class DemandApp(Application):
    """``kernelfleet demand``: the autoscaler's demand model."""

    name = "kernelfleet-demand"
    version = __version__
    description = "The autoscaler's demand model."
    subcommands = {
        "train": (
            "kernelfleet.scheduler.demand_app.DemandTrainApp",
            "Train a demand model on a trace and write it (.json).",
        ),
    }

    def start(self) -> None:
        if self.subapp is not None:
            self.subapp.start()
            return
        self.print_help()
        self.exit(1)
