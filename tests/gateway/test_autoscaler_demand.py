"""The live autoscaler with a demand model (`gateway/demand.py`): the cells the gateway counts
reach the model's features, and its prediction reaches the rule through the snapshot, which
adds hosts before the cells ask for them."""

from __future__ import annotations

from kernelfleet.gateway.demand import LiveDemand
from kernelfleet.scheduler import Hold, ScaleOut
from kernelfleet.scheduler.demand import FEATURES
from kernelfleet.scheduler.demand_model import DemandModel, Tree

from .test_autoscaler import Clock, FakeFleet, FakeProvider, autoscaler

# one split: busy GPUs rise by 4 within the horizon when a cell was submitted in the last step
RISE_AFTER_ARRIVALS = Tree(
    left=(1, -1, -1),
    right=(2, -1, -1),
    feature=(FEATURES.index("arrival_gpus_in_window"), -2, -2),
    threshold=(0.5, -2.0, -2.0),
    value=(0.0, 0.0, 4.0),
)
MODEL = DemandModel(
    step_s=60,
    window=1,
    horizon_s=60,
    gpus_per_host=2,
    quantile=0.9,
    margin_gpus=0.5,
    trees=(RISE_AFTER_ARRIVALS,),
    trained={},
    quality={},
)


async def test_counted_cells_make_the_autoscaler_add_hosts_ahead_of_demand() -> None:
    wall = Clock()
    wall.now = 0.0
    fleet = FakeFleet({"h1": (1, 0)})  # 1 of its 2 GPUs committed
    demand = LiveDemand(MODEL, "model.json", sessions=lambda: 1, clock=wall)
    scaler = autoscaler(fleet, FakeProvider(), demand=demand)
    assert (await scaler.run_once()).decision == Hold()  # no window of history yet
    wall.now = 60.0
    assert scaler.snapshot().predicted_gpus == 1.5  # busy 1 + no rise + margin 0.5
    assert (await scaler.run_once()).decision == Hold()
    demand.cell_submitted(2)  # counted in the step from 60 s
    demand.cell_ended(1)
    wall.now = 120.0
    result = await scaler.run_once()
    assert scaler.snapshot().predicted_gpus == 5.5  # busy 1 + rise 4 + margin 0.5: 3 hosts
    assert result.decision == ScaleOut(2)
    assert result.started == ("auto-1", "auto-2")
    model = scaler.model()["demand_model"]
    assert (model["file"], model["predicted_gpus"]) == ("model.json", 5.5)
