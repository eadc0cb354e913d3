"""The layer profiler on CPU torch: sizes by closed form, a backward pass through every layer,
in-place layers, and models it cannot profile."""

from __future__ import annotations

from typing import Any

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.planner import plan_pipeline
from kernelfleet.tools.pipeline.profiler import profile_model

torch = pytest.importorskip("torch")
nn = torch.nn


class CountBackward(nn.Module):
    """The identity, counting the backward passes that reach it."""

    def __init__(self) -> None:
        super().__init__()
        self.backwards = 0
        module = self

        class Identity(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: Any) -> Any:
                return x.view_as(x)

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                module.backwards += 1
                return grad

        self.identity = Identity

    def forward(self, x: Any) -> Any:
        return self.identity.apply(x)


def small_cnn() -> Any:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.ReLU(inplace=True),
        CountBackward(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(8 * 8 * 8, 10),
    )


def test_sizes_match_the_closed_form_and_backward_reaches_every_layer() -> None:
    model = small_cnn()
    batch = torch.randn(4, 3, 16, 16)
    profile = profile_model(model, batch, repeats=2, warmup=1)
    assert [layer.name for layer in profile.layers] == ["0", "1", "2", "3", "4", "5"]
    assert profile.layers[0].description.startswith("Conv2d(3, 8")
    floats = 4  # bytes of a float32
    assert [layer.activation_bytes for layer in profile.layers] == [
        4 * 8 * 16 * 16 * floats,
        4 * 8 * 16 * 16 * floats,
        4 * 8 * 16 * 16 * floats,
        4 * 8 * 8 * 8 * floats,
        4 * 512 * floats,
        4 * 10 * floats,
    ]
    assert profile.layers[0].parameter_bytes == (8 * 3 * 9 + 8) * floats
    assert profile.layers[5].parameter_bytes == (512 * 10 + 10) * floats
    assert sum(layer.parameter_bytes for layer in profile.layers[1:5]) == 0
    assert all(layer.forward_s > 0 and layer.backward_s > 0 for layer in profile.layers)
    # the backward of every pass went through the middle of the model, one layer at a time
    assert model[2].backwards == 3
    assert profile.is_chain()
    assert all(p.grad is None for p in model.parameters())  # gradients left as they were


def test_shared_parameters_count_once_and_the_plan_runs() -> None:
    model = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh())
    model[2].weight = model[0].weight  # tied weights: counted at their first layer only
    model[0].weight.grad = torch.ones_like(model[0].weight)
    profile = profile_model(model, torch.randn(2, 16), repeats=1, warmup=0)
    assert [layer.parameter_bytes for layer in profile.layers] == [(256 + 16) * 4, 0, 16 * 4, 0]
    assert torch.equal(model[0].weight.grad, torch.ones_like(model[0].weight))
    plan = plan_pipeline(profile, 2, 1e9)
    assert sum(stage.replicas for stage in plan.stages) == 2


def test_custom_loss_and_tuple_outputs() -> None:
    class Split(nn.Module):
        def forward(self, x: Any) -> Any:
            return x[:, :3], x[:, 3:]

    class Join(nn.Module):
        def forward(self, parts: Any) -> Any:
            return torch.cat(parts, dim=1)

    class Model(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.first, self.split, self.join = nn.Linear(5, 6), Split(), Join()

        def forward(self, x: Any) -> Any:
            return self.join(self.split(self.first(x)))

    seen = []

    def loss(output: Any) -> Any:
        seen.append(tuple(output.shape))
        return output.pow(2).mean()

    profile = profile_model(Model(), torch.randn(3, 5), loss=loss, repeats=1, warmup=0)
    assert [layer.activation_bytes for layer in profile.layers] == [72.0, 72.0, 72.0]
    assert seen == [(3, 6)]


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        (nn.ReLU(), {}, "a model made of layers"),
        (nn.Sequential(nn.ReLU()), {"repeats": 0}, "repeats must be"),
    ],
)
def test_models_it_cannot_profile(model: Any, kwargs: dict[str, int], message: str) -> None:
    with pytest.raises(InvalidRequest, match=message):
        profile_model(model, torch.randn(2, 3), **kwargs)


def test_a_layer_called_twice_is_refused() -> None:
    class Twice(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = nn.Linear(3, 3)

        def forward(self, x: Any) -> Any:
            return self.layer(self.layer(x))

    with pytest.raises(InvalidRequest, match="more than once or not at all"):
        profile_model(Twice(), torch.randn(2, 3), repeats=1, warmup=0)
