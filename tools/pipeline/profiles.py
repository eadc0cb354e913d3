"""What the planner reads: a model as an ordered list of layers with their measured costs.

A `ModelProfile` is PipeDream's view of a model. Its layers come in one fixed order (for a
``torch.nn.Sequential`` the order of its children; for a PipeDream ``graph.txt`` the order of
PipeDream's antichain states, see `kernelfleet.tools.pipeline.graphfile`), and a pipeline stage
is always a run of consecutive layers ``[first, last]`` of that order. Layer numbers in plans
are positions in this order, counted from 0.

Costs are per minibatch, at the batch size the profile was measured with: times in seconds,
sizes in bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kernelfleet.errors import InvalidRequest


@dataclass(frozen=True)
class LayerProfile:
    """One layer: what it costs and what it holds.

    ``activation_bytes`` is the layer's output, the tensor a stage boundary right after this layer
    would send on (and what a stage keeps for the backward pass); ``parameter_bytes`` its weights.
    """

    name: str
    description: str
    forward_s: float
    backward_s: float
    activation_bytes: float
    parameter_bytes: float

    @property
    def compute_s(self) -> float:
        """Forward plus backward time of one minibatch."""
        return self.forward_s + self.backward_s


@dataclass(frozen=True)
class Totals:
    """Sums over the layers from the first one through some layer (what a prefix costs)."""

    compute_s: float = 0.0
    activation_bytes: float = 0.0
    parameter_bytes: float = 0.0

    def __sub__(self, other: Totals) -> Totals:
        return Totals(
            self.compute_s - other.compute_s,
            self.activation_bytes - other.activation_bytes,
            self.parameter_bytes - other.parameter_bytes,
        )


@dataclass(frozen=True)
class ModelProfile:
    """Layers in planning order, with what every prefix of them costs.

    ``through[j]`` is the cost of everything up to and including layer ``j``, so a stage
    ``[k + 1, j]`` costs ``through[j] - through[k]``. ``splits[j]`` holds the layers ``k < j``
    after which a stage ending at ``j`` may begin: every earlier layer for a chain; for a graph,
    only the states from which ``j`` can be reached (a boundary must be a cut of the graph).

    Build a chain with `ModelProfile.chain`; `graphfile.read_graph_profile` builds the general
    form. The constructor checks the shape and raises `InvalidRequest` when it is wrong.
    """

    layers: tuple[LayerProfile, ...]
    through: tuple[Totals, ...]
    splits: tuple[frozenset[int], ...]
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.layers:
            raise InvalidRequest("the profile has no layers")
        if not len(self.layers) == len(self.through) == len(self.splits):
            raise InvalidRequest(
                f"profile shape: {len(self.layers)} layers, {len(self.through)} prefix totals, "
                f"{len(self.splits)} split sets"
            )
        for j, allowed in enumerate(self.splits):
            if any(not 0 <= k < j for k in allowed):
                raise InvalidRequest(f"layer {j} may only follow a split after an earlier layer")

    @classmethod
    def chain(cls, layers: Sequence[LayerProfile], *, source: str = "") -> ModelProfile:
        """A model whose layers run one after another (a ``Sequential``)."""
        through: list[Totals] = []
        running = Totals()
        for layer in layers:
            running = Totals(
                running.compute_s + layer.compute_s,
                running.activation_bytes + layer.activation_bytes,
                running.parameter_bytes + layer.parameter_bytes,
            )
            through.append(running)
        splits = tuple(frozenset(range(j)) for j in range(len(layers)))
        return cls(tuple(layers), tuple(through), splits, source=source)

    def __len__(self) -> int:
        return len(self.layers)

    @property
    def total(self) -> Totals:
        """What the whole model costs (one worker runs all of it)."""
        return self.through[-1]

    def stage(self, first: int, last: int) -> Totals:
        """What the stage ``[first, last]`` costs (``first`` must be 0 or follow a split)."""
        if first == 0:
            return self.through[last]
        return self.through[last] - self.through[first - 1]

    def is_chain(self) -> bool:
        """True when any layer may start a stage."""
        return all(allowed == frozenset(range(j)) for j, allowed in enumerate(self.splits))
