"""The replicated executor: one rank's replica of one stage, trained with flush semantics
(PipeDream-Flush), over ``torch.distributed`` point-to-point sends and receives.

torch's pipeline schedules hold one copy of each stage, so replicated stages run here instead.
The layout (`replicas.ReplicaLayout`): stage ``i`` has ``r_i`` replicas, one rank each;
microbatch ``j`` runs on replica ``j mod r_i`` of every stage ``i``. One step, on every rank:

1. Gradients are cleared; the batch (on stage 0's replicas) and the targets (on the last
   stage's) are cut into ``M`` equal microbatches.
2. The rank runs its operations in the order of the schedule's clock (`replicas.clock_of`):
   - ``F(j)``: receive microbatch ``j``'s activation from the upstream replica that ran it
     (stage 0 takes it from the batch), run the stage, and send the output to the downstream
     replica that runs ``j`` (the last stage computes the loss instead);
   - ``B(j)``: receive the gradient of that output from the downstream replica (the last stage
     backpropagates its loss divided by ``M``), backpropagate, and send the gradient of the
     input to the upstream replica (stage 0 sends nothing).
3. It waits until its sends have been taken, then sums its gradients with the other replicas of
   its stage (``all_reduce`` in a process group of those replicas, made with ``dist.new_group``)
   and takes one SGD step. The replicas hold the same weights and the same summed gradient, so
   they stay identical; and since each microbatch's loss was divided by ``M``, the summed
   gradient is the whole batch's: one step equals one process's step on the whole batch.
4. The last stage's replicas sum their losses (the step's loss is their mean over the ``M``
   microbatches) and its replica 0 reports it.

An activation travels as two messages, a header (dtype and shape) and the tensor; a gradient
travels as the tensor alone, since its receiver sent the activation and knows its shape. Tags
are ``2j`` and ``2j + 1``; messages between two ranks with one tag arrive in the order sent.

**Why it cannot deadlock.** Every send is an ``isend`` whose completion is awaited only after
the rank has run all its operations; gloo's ``isend`` never blocks (it queues the message until
the receiver asks for it), so a rank waits only in a receive, and only for an operation with an
earlier time on the clock (`replicas.check_clock`: a forward depends only on upstream forwards,
a backward only on downstream backwards and on its own forward). Suppose ranks were stuck, and
take the stuck receive with the earliest time: the operation it waits for has an earlier time,
on a rank that runs its operations in order of time, so that rank has either done it or is stuck
on an even earlier one; both contradict the choice. Once every rank has run its operations,
every send has its receive; the all-reduces are in disjoint groups, one per rank. Sends between
the same two ranks keep their order, so a message never meets the wrong receive, also from one
step to the next.

The messages always go through gloo: on the CPU the run's own process group, on GPUs a gloo
group made for the run (activations and gradients then pass through host memory), so that the
argument above holds on both. (nccl's sends may wait for their receive, and 1F1B's orders would
then deadlock: torch's schedules batch their sends and receives for that reason.) The gradient
all-reduce uses the run's backend.

Limits: a stage takes one tensor and returns one floating-point tensor (a ``Sequential`` of
layers that do); activations have at most `MAX_DIMS` dimensions.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from kernelfleet.tools.pipeline.replicas import Operation, ReplicaLayout

if TYPE_CHECKING:
    from kernelfleet.tools.pipeline.channel import Channel
    from kernelfleet.tools.pipeline.worker import WorkerJob

MAX_DIMS = 8
DTYPES = ("float32", "float64", "float16", "bfloat16")
"""Activation dtypes by header code (their position here)."""


class Groups:
    """The process groups of one run: ``p2p`` (gloo) for sends and receives, and for each
    replicated stage a group of its replicas. Made by every rank in the same order, as
    ``dist.new_group`` requires; `close` destroys the ones made here."""

    def __init__(self, layout: ReplicaLayout, stage: int) -> None:
        import torch.distributed as dist

        self.made: list[Any] = []
        if dist.get_backend() == "gloo":
            self.p2p: Any = dist.group.WORLD
        else:
            self.p2p = self._new(None, "gloo")
        self.replicas: Any = None
        for each in range(layout.stages):
            if layout.replicas[each] > 1:
                group = self._new(list(layout.ranks_of(each)), None)
                if each == stage:
                    self.replicas = group

    def _new(self, ranks: list[int] | None, backend: str | None) -> Any:
        import torch.distributed as dist

        group = dist.new_group(ranks, backend=backend)
        self.made.append(group)
        return group

    def close(self) -> None:
        import torch.distributed as dist

        for group in self.made:
            dist.destroy_process_group(group)


def run_replicated(job: WorkerJob, device: Any, channel: Channel) -> None:
    """Train this rank's replica of ``job``'s stage for ``job.steps`` steps (the module
    docstring), reporting each step's loss from the last stage's replica 0 and this stage's
    trained state from replica 0 of every stage."""
    import torch
    import torch.distributed as dist

    if job.replicas is None:
        raise ValueError("a job without replicas runs on torch's schedules, not here")
    layout = ReplicaLayout(job.replicas)
    rank = dist.get_rank()
    stage, replica = layout.placement(rank)
    module = job.stages[stage].to(device)
    groups = Groups(layout, stage)
    runner = _StageReplica(job, layout, rank, module, device, groups)
    optimizer = torch.optim.SGD(runner.parameters, lr=job.lr) if runner.parameters else None
    last = stage == layout.stages - 1
    for step in range(job.steps):
        started = time.perf_counter()
        if optimizer is not None:
            optimizer.zero_grad(set_to_none=True)
        loss = runner.step()
        if optimizer is not None:
            optimizer.step()
        if last and replica == 0:
            channel.send(("step", step, loss, time.perf_counter() - started))
    if replica == 0:
        state = {key: value.detach().cpu() for key, value in module.state_dict().items()}
        channel.send(("state", {stage: state}))
    groups.close()  # not after a failure: the pool then ends, and its groups with it


class _StageReplica:
    """One step of one replica: its operations in clock order, then the gradient sum."""

    def __init__(
        self,
        job: WorkerJob,
        layout: ReplicaLayout,
        rank: int,
        module: Any,
        device: Any,
        groups: Groups,
    ) -> None:
        import torch

        self.job = job
        self.layout = layout
        self.module = module
        self.device = device
        self.groups = groups
        self.stage, _ = layout.placement(rank)
        self.last = self.stage == layout.stages - 1
        self.operations = layout.operations(rank, job.schedule, job.microbatches)
        self.parameters = list(module.parameters())
        first, last = self.stage == 0, self.last
        self.inputs = torch.tensor_split(job.inputs.to(device), job.microbatches) if first else ()
        self.targets = torch.tensor_split(job.targets.to(device), job.microbatches) if last else ()
        self.pending: list[tuple[Any, Any]] = []
        """This step's sends not yet waited for: (work, tensor), the tensor kept alive."""
        self.saved: dict[int, tuple[Any, Any]] = {}
        """By microbatch, its input and its output (the last stage: its loss) until backward."""
        self.loss_sum = torch.zeros((), dtype=torch.float64)

    def step(self) -> float:
        """Run this step's operations, sum gradients over the replicas; the step's loss (the
        mean over all microbatches; meaningful on the last stage only)."""
        import torch
        import torch.distributed as dist

        self.pending, self.saved = [], {}
        self.loss_sum = torch.zeros((), dtype=torch.float64)
        for operation in self.operations:
            if operation.kind == "F":
                self._forward(operation)
            else:
                self._backward(operation)
        for work, _tensor in self.pending:
            work.wait()
        self._sum_gradients()
        if self.last and self.groups.replicas is not None:
            total = self.loss_sum.to(self.device)
            dist.all_reduce(total, group=self.groups.replicas)
            return float(total.item()) / self.job.microbatches
        return float(self.loss_sum.item()) / self.job.microbatches

    def _forward(self, operation: Operation) -> None:
        j = operation.microbatch
        if self.stage == 0:
            activation = self.inputs[j]
        else:
            activation = self._receive_activation(j).requires_grad_()
        output = self.module(activation)
        if self.last:
            loss = self.job.loss(output, self.targets[j])
            self.loss_sum += loss.detach().double().cpu()
            self.saved[j] = (activation, loss)
        else:
            self.saved[j] = (activation, output)
            self._send_activation(output.detach(), j)

    def _backward(self, operation: Operation) -> None:
        import torch

        j = operation.microbatch
        activation, output = self.saved.pop(j)
        if self.last:
            gradient = None
            output = output / self.job.microbatches
        else:
            gradient = self._receive_gradient(output, j)
        if output.requires_grad:  # not after a first stage without parameters
            torch.autograd.backward(output, gradient)
        if self.stage > 0:
            sent = activation.grad if activation.grad is not None else torch.zeros_like(activation)
            self._isend(sent, self.layout.rank_running(self.stage - 1, j), tag=2 * j)

    def _sum_gradients(self) -> None:
        import torch
        import torch.distributed as dist

        if self.groups.replicas is None or not self.parameters:
            return
        gradients = [p.grad if p.grad is not None else torch.zeros_like(p) for p in self.parameters]
        flat = torch.cat([g.reshape(-1) for g in gradients])
        dist.all_reduce(flat, group=self.groups.replicas)
        offset = 0
        for parameter, gradient in zip(self.parameters, gradients, strict=True):
            size = gradient.numel()
            parameter.grad = flat[offset : offset + size].view_as(gradient).clone()
            offset += size

    # ---- messages ----------------------------------------------------------------------------

    def _isend(self, tensor: Any, destination: int, tag: int) -> None:
        import torch.distributed as dist

        tensor = tensor.detach().contiguous().cpu()
        work = dist.isend(tensor, destination, group=self.groups.p2p, tag=tag)
        self.pending.append((work, tensor))

    def _receive(self, tensor: Any, source: int, tag: int) -> Any:
        import torch.distributed as dist

        dist.recv(tensor, source, group=self.groups.p2p, tag=tag)
        return tensor

    def _send_activation(self, output: Any, j: int) -> None:
        import torch

        if not output.is_floating_point() or output.dim() > MAX_DIMS:
            raise ValueError(
                f"stage {self.stage} returned a {output.dtype} tensor of {output.dim()} "
                f"dimensions: replicated stages pass floating-point tensors of at most "
                f"{MAX_DIMS} dimensions"
            )
        shape = list(output.shape) + [0] * (MAX_DIMS - output.dim())
        code = DTYPES.index(str(output.dtype).removeprefix("torch."))
        header = torch.tensor([code, output.dim(), *shape], dtype=torch.int64)
        destination = self.layout.rank_running(self.stage + 1, j)
        self._isend(header, destination, tag=2 * j)
        self._isend(output, destination, tag=2 * j + 1)

    def _receive_activation(self, j: int) -> Any:
        import torch

        source = self.layout.rank_running(self.stage - 1, j)
        header = self._receive(torch.empty(2 + MAX_DIMS, dtype=torch.int64), source, tag=2 * j)
        code, dims, *shape = header.tolist()
        dtype = getattr(torch, DTYPES[code])
        activation = self._receive(torch.empty(shape[:dims], dtype=dtype), source, tag=2 * j + 1)
        return activation.to(self.device)

    def _receive_gradient(self, output: Any, j: int) -> Any:
        import torch

        source = self.layout.rank_running(self.stage + 1, j)
        gradient = torch.empty(output.shape, dtype=output.dtype)
        return self._receive(gradient, source, tag=2 * j).to(self.device)
