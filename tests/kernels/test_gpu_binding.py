"""In-kernel GPU binding: the walk and the device mapping on a fake torch, the real torch on CPU
(the accelerator check injected), and real device memory on a GPU machine."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from kernelfleet.kernels.replica.gpu_binding import ENV_VAR, GpuBinder, MoveReport

# ---- a fake torch: enough of the API for the walk, the moves and the CUDA calls -----------------


@dataclass(frozen=True)
class Device:
    type: str
    index: int | None

    @classmethod
    def parse(cls, text: str) -> Device:
        kind, _, index = text.partition(":")
        return cls(kind, int(index) if index else None)

    def __str__(self) -> str:
        return self.type if self.index is None else f"{self.type}:{self.index}"


@dataclass
class Storage:
    device: Device
    items: int

    def to(self, device: Any) -> Storage:
        return Storage(Device.parse(str(device)), self.items)


class Tensor:
    def __init__(self, device: str = "cuda:0", items: int = 4) -> None:
        self.data = Storage(Device.parse(device), items)
        self.grad: Tensor | None = None

    @property
    def device(self) -> Device:
        return self.data.device

    def element_size(self) -> int:
        return 4

    def nelement(self) -> int:
        return self.data.items


class Module:
    def __init__(self, *params: Tensor) -> None:
        self.params = list(params)

    def parameters(self) -> list[Tensor]:
        return self.params

    def buffers(self) -> list[Tensor]:
        return []

    def to(self, device: Any) -> Module:
        for param in self.params:
            param.data = param.data.to(device)
        return self


class Optimizer:
    def __init__(self, params: list[Tensor], state: dict[Tensor, dict[str, Any]]) -> None:
        self.param_groups = [{"params": params}]
        self.state = state


@dataclass
class Cuda:
    devices: list[int] = field(default_factory=list)
    emptied: int = 0

    def is_available(self) -> bool:
        return True

    def is_initialized(self) -> bool:
        return True

    def set_device(self, index: int) -> None:
        self.devices.append(index)

    def empty_cache(self) -> None:
        self.emptied += 1


def fake_torch() -> SimpleNamespace:
    return SimpleNamespace(
        Tensor=Tensor,
        nn=SimpleNamespace(Module=Module),
        optim=SimpleNamespace(Optimizer=Optimizer),
        cuda=Cuda(),
    )


class Plain:
    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


def where(*tensors: Tensor) -> list[str]:
    return [str(t.device) for t in tensors]


# ---- without torch ----------------------------------------------------------------------------


def test_without_torch_everything_is_a_cheap_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    environ: dict[str, str] = {}
    binder = GpuBinder(environ=environ)
    namespace = {f"v{i}": list(range(100)) for i in range(1000)}
    binder.bind(["0", "1"])
    assert environ[ENV_VAR] == "0,1"
    started = time.perf_counter()
    assert binder.release(namespace) == MoveReport()
    assert binder.reacquire(namespace, ["1"]) == MoveReport()
    assert time.perf_counter() - started < 0.01, "no walk without torch"
    assert environ[ENV_VAR] == "1"
    assert "torch" not in sys.modules


# ---- on a fake torch --------------------------------------------------------------------------


def test_bind_sets_the_environment_and_the_torch_device() -> None:
    torch, environ = fake_torch(), {}
    binder = GpuBinder(torch=torch, environ=environ)
    binder.bind(["3", "1"])
    assert environ[ENV_VAR] == "3,1"
    assert torch.cuda.devices == [3]
    binder.bind(["GPU-virtual-h-0"])  # not an index: the variable only
    assert environ[ENV_VAR] == "GPU-virtual-h-0"
    assert torch.cuda.devices == [3]
    binder.bind([])
    assert environ[ENV_VAR] == ""


def test_release_moves_what_the_bounded_walk_finds() -> None:
    torch, environ = fake_torch(), {}
    binder = GpuBinder(torch=torch, environ=environ, max_items=10)
    t, t2, t3, t5, deep = Tensor(), Tensor(), Tensor(), Tensor(), Tensor()
    t.grad = Tensor()
    p1, p2, exp_avg, step = Tensor(items=100), Tensor(items=100), Tensor(), Tensor("cpu")
    net = Module(p1, p2)
    namespace = {
        "t": t,
        "alias": t,
        "pair": (t2, 1, "x"),
        "nested": {"a": [t3]},
        "too_deep": {"a": {"b": [deep]}},
        "trainer": Plain(tensor=t5, name="run"),
        "net": net,
        "opt": Optimizer([p1, p2], {p1: {"exp_avg": exp_avg, "step": step}}),
        "on_cpu": Tensor("cpu"),
        "big": [Tensor() for _ in range(11)],
        "module": sys,  # never walked
    }
    binder.bind(["0"])
    report = binder.release(namespace)
    assert (report.tensors, report.modules, report.optimizers) == (5, 1, 1)
    assert report.bytes == 4 * (4 * 5 + 200)
    assert report.skipped == ("big (11 items)",)
    assert where(t, t.grad, t2, t3, t5, p1, p2, exp_avg, step) == ["cpu"] * 9
    assert where(deep) == ["cuda:0"]
    assert torch.cuda.emptied == 1
    assert environ[ENV_VAR] == ""

    again = binder.reacquire(namespace, ["0"])
    assert (again.tensors, again.modules) == (5, 1)
    assert where(t, t.grad, t2, t3, t5, p1, p2, exp_avg) == ["cuda:0"] * 8
    assert where(step) == ["cpu"]  # never was on a GPU


def test_reacquire_maps_old_devices_onto_the_new_ones() -> None:
    torch = fake_torch()
    binder = GpuBinder(torch=torch, environ={})
    on2, on3, elsewhere = Tensor("cuda:2"), Tensor("cuda:3"), Tensor("cuda:7")
    split = Module(Tensor("cuda:2"), Tensor("cuda:3"))  # model parallel: moved per tensor
    namespace = {"a": on2, "b": on3, "c": elsewhere, "split": split}
    binder.bind(["2", "3"])
    report = binder.release(namespace)
    assert (report.tensors, report.modules) == (5, 0)
    binder.reacquire(namespace, ["5", "4"])
    assert where(on2, on3, elsewhere, *split.params) == [
        "cuda:5",
        "cuda:4",
        "cuda:5",
        "cuda:5",
        "cuda:4",
    ]
    assert torch.cuda.devices == [2, 5]


def test_what_the_namespace_dropped_stays_behind() -> None:
    binder = GpuBinder(torch=fake_torch(), environ={})
    kept, dropped = Tensor(), Tensor()
    net = Module(Tensor())
    opt = Optimizer(net.params, {})
    namespace: dict[str, Any] = {"kept": kept, "dropped": dropped, "net": net, "opt": opt}
    binder.bind(["0"])
    binder.release(namespace)
    del namespace["dropped"], namespace["net"]  # the optimizer still reaches the module's params
    report = binder.reacquire(namespace, ["0"])
    assert (report.tensors, report.modules) == (1, 1)
    assert where(kept, *net.params, dropped) == ["cuda:0", "cuda:0", "cpu"]


def test_without_devices_reacquire_keeps_everything_in_host_memory() -> None:
    binder = GpuBinder(torch=fake_torch(), environ={})
    tensor = Tensor()
    namespace = {"t": tensor}
    binder.bind(["0"])
    binder.release(namespace)
    assert binder.reacquire(namespace, []).skipped == ("no device bound: kept in host memory",)
    assert where(tensor) == ["cpu"]
    assert binder.reacquire(namespace, ["1"]).tensors == 1
    assert where(tensor) == ["cuda:1"]


# ---- the real torch, on CPU ---------------------------------------------------------------------


def test_real_torch_modules_optimizers_and_tensors_survive_a_round_trip() -> None:
    import torch

    binder = GpuBinder(
        is_accelerator=lambda device: device.type == "cpu",  # pretend the CPU is the GPU
        device_for=lambda device_id: torch.device("cpu"),
        environ={},
    )
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    x = torch.randn(16, 8)
    net(x).sum().backward()
    opt.step()
    namespace = {"net": net, "opt": opt, "batch": (x, x * 2), "untouched": 3}
    expected = {k: v.clone() for k, v in net.state_dict().items()}
    binder.bind(["0"])
    released = binder.release(namespace)
    assert (released.modules, released.optimizers) == (1, 1)
    assert released.tensors == 2 + 4 * 3  # the batch; Adam's exp_avg, exp_avg_sq, step x 4
    assert released.bytes > 0
    back = binder.reacquire(namespace, ["0"])
    assert (back.modules, back.tensors) == (1, released.tensors)
    assert opt.param_groups[0]["params"][0] is net[0].weight
    for key, value in net.state_dict().items():
        assert torch.equal(value, expected[key]), key
    net(x).sum().backward()
    opt.step()  # training goes on


def test_real_torch_on_cpu_is_left_alone_by_default() -> None:
    import torch

    net = torch.nn.Linear(4, 4)
    report = GpuBinder(environ={}).release({"net": net, "t": torch.ones(3)})
    assert (report.tensors, report.modules, report.bytes) == (0, 0, 0)


# ---- a real GPU ---------------------------------------------------------------------------------


@pytest.mark.gpu
def test_device_memory_is_really_freed_and_restored() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    gib = 1 << 30
    binder = GpuBinder(environ={})
    binder.bind(["0"])
    model = torch.nn.Linear(4096, 4096).cuda()
    weights = torch.empty(gib // 4, dtype=torch.float32, device="cuda:0").normal_()
    checksum = float(weights[:1000].sum())
    namespace = {"model": model, "weights": weights}
    torch.cuda.synchronize()
    allocated, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
    released = binder.release(namespace)
    torch.cuda.synchronize()
    freed = allocated - torch.cuda.memory_allocated()
    print(
        f"\nrelease: {released.bytes / gib:.2f} GiB in {released.seconds:.3f} s; "
        f"allocated {allocated / gib:.2f} -> {torch.cuda.memory_allocated() / gib:.2f} GiB, "
        f"reserved {reserved / gib:.2f} -> {torch.cuda.memory_reserved() / gib:.2f} GiB"
    )
    assert freed >= gib
    assert torch.cuda.memory_reserved() <= reserved - gib
    assert weights.device.type == "cpu"
    back = binder.reacquire(namespace, ["0"])
    torch.cuda.synchronize()
    print(f"reacquire: {back.bytes / gib:.2f} GiB in {back.seconds:.3f} s")
    assert weights.device == torch.device("cuda:0")
    assert model.weight.device == torch.device("cuda:0")
    assert float(weights[:1000].sum()) == checksum
