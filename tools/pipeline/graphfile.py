"""PipeDream's ``graph.txt`` profiles, read into a `ModelProfile` in PipeDream's planning order.

The format (what PipeDream's profiler writes): one line per operator,

    node7 -- Conv2d(64, 128, kernel_size=(3, 3)) -- forward_compute_time=15.155, \
backward_compute_time=39.648, activation_size=822083584.000, parameter_size=295424.000

(times in milliseconds per minibatch, sizes in bytes; ``activation_size`` may be a list
``[a; b]`` for an operator with several outputs, which counts as their sum; a fourth field
``stage_id=N`` may follow), then one line per edge, starting with a tab: ``\\tnode6 -- node7``.

What PipeDream's optimizer (``optimizer_graph_hierarchical.py``) does with it, and so what this
reader does:

1. Sources whose description starts with ``Input`` are removed (the input always lives on the
   first stage), and so are sinks whose description starts with ``__getitem__``.
2. The graph is turned into a DAG of *antichain states*. Starting from the first source (in file
   order), a state is a set of operators none of which depends on another (an antichain); it
   stands for the cut right after them: everything they depend on is upstream of it. A state's
   *augmented* antichain adds the upstream operators whose outputs are still read past the
   cut (a skip connection's tensor). A next state replaces one operator of the augmented
   antichain by one of its consumers, when none of that consumer's descendants is in the set,
   and drops operators the new one depends on.
3. The states are sorted topologically (a depth-first search over the states in the order they
   were found, children in the order they were found, each state placed before all it leads
   to). That order is the *profile order*: layer ``i`` of the profile is the ``i``-th state, and
   plans number layers by it. For a chain of operators, state ``i`` is simply operator ``i``
   after the input.
4. For each state, ``through`` sums forward plus backward time, activation and parameter sizes
   over the augmented antichain and everything upstream of it; its output activation is the sum
   over the augmented antichain. A stage may end at state ``j`` after state ``k`` only when ``k``
   is upstream of ``j`` in the state DAG (``ModelProfile.splits``).

Two places where PipeDream's own order depends on Python's set iteration (which varies between
runs) are made deterministic here: the upstream operators an augmentation adds are taken in file
order. For graphs whose augmented antichains add at most one operator (chains, and VGG's
``Size``/``View`` fork) the order is PipeDream's exactly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.profiles import LayerProfile, ModelProfile, Totals

MS = 1e-3
_FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_METADATA = re.compile(
    r"^forward_compute_time=(?P<forward>\S+), backward_compute_time=(?P<backward>\S+), "
    r"activation_size=(?P<activation>\[[^\]]*\]|\S+), parameter_size=(?P<parameters>\S+)$"
)


class GraphFormatError(InvalidRequest):
    """A ``graph.txt`` that cannot be read; the message names the line and the reason."""

    reason = "bad-profile"


@dataclass
class Operator:
    """One line of the node section."""

    node_id: str
    description: str
    forward_ms: float
    backward_ms: float
    activation_bytes: float
    parameter_bytes: float


@dataclass
class OperatorGraph:
    """The operators (in file order) and their edges (each operator's consumers in file order)."""

    operators: dict[str, Operator] = field(default_factory=dict)
    consumers: dict[str, list[str]] = field(default_factory=dict)
    producers: dict[str, list[str]] = field(default_factory=dict)

    def add_edge(self, producer: str, consumer: str) -> None:
        self.consumers.setdefault(producer, []).append(consumer)
        self.producers.setdefault(consumer, []).append(producer)

    def remove(self, node_id: str) -> None:
        del self.operators[node_id]
        for consumer in self.consumers.pop(node_id, []):
            self.producers[consumer].remove(node_id)
        for producer in self.producers.pop(node_id, []):
            self.consumers[producer].remove(node_id)

    def sources(self) -> list[str]:
        return [n for n in self.operators if not self.producers.get(n)]

    def sinks(self) -> list[str]:
        return [n for n in self.operators if not self.consumers.get(n)]


def parse_graph(text: str, *, name: str = "graph.txt") -> OperatorGraph:
    """The operators and edges of a ``graph.txt``; `GraphFormatError` names the bad line."""
    graph = OperatorGraph()
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{name}, line {number}"
        if line.startswith("\t"):
            producer, sep, consumer = line.strip().partition(" -- ")
            if not sep or not producer or not consumer or " -- " in consumer:
                raise GraphFormatError(f"{where}: an edge line is 'TAB node -- node', got {line!r}")
            for node_id in (producer, consumer):
                if node_id not in graph.operators:
                    raise GraphFormatError(f"{where}: edge names {node_id!r}, no such node above")
            graph.add_edge(producer, consumer)
            continue
        if graph.consumers:
            raise GraphFormatError(f"{where}: a node line after the edges began")
        operator = _parse_operator(line, where)
        if operator.node_id in graph.operators:
            raise GraphFormatError(f"{where}: node {operator.node_id!r} appears twice")
        graph.operators[operator.node_id] = operator
    if not graph.operators:
        raise GraphFormatError(f"{name}: no nodes")
    _check_acyclic(graph, name)
    return graph


def _parse_operator(line: str, where: str) -> Operator:
    parts = line.strip().split(" -- ")
    if len(parts) > 3 and re.fullmatch(r"stage_id=\d+", parts[-1]):
        parts = parts[:-1]
    if len(parts) < 3:
        raise GraphFormatError(
            f"{where}: a node line is 'id -- description -- {', '.join(f + '=X' for f in _FIELDS)}'"
        )
    node_id, description, metadata = parts[0], " -- ".join(parts[1:-1]), parts[-1]
    match = _METADATA.match(metadata)
    if match is None:
        raise GraphFormatError(
            f"{where}: node {node_id}: expected {', '.join(f + '=X' for f in _FIELDS)}, "
            f"got {metadata!r}"
        )
    try:
        values = {key: _number(value) for key, value in match.groupdict().items()}
    except ValueError as error:
        raise GraphFormatError(f"{where}: node {node_id}: {error}") from None
    negative = [key for key, value in values.items() if value < 0]
    if negative:
        raise GraphFormatError(f"{where}: node {node_id}: negative {', '.join(negative)}")
    return Operator(
        node_id,
        description,
        forward_ms=values["forward"],
        backward_ms=values["backward"],
        activation_bytes=values["activation"],
        parameter_bytes=values["parameters"],
    )


def _number(text: str) -> float:
    if text.startswith("["):
        return sum(_number(part) for part in text[1:-1].split("; ") if part.strip())
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text!r} is not a finite number")
    return value


def _check_acyclic(graph: OperatorGraph, name: str) -> None:
    indegree = {n: len(graph.producers.get(n, [])) for n in graph.operators}
    ready = [n for n, d in indegree.items() if d == 0]
    seen = 0
    while ready:
        node = ready.pop()
        seen += 1
        for consumer in graph.consumers.get(node, []):
            indegree[consumer] -= 1
            if indegree[consumer] == 0:
                ready.append(consumer)
    if seen < len(graph.operators):
        stuck = sorted(n for n, d in indegree.items() if d > 0)
        raise GraphFormatError(f"{name}: the edges form a cycle through {', '.join(stuck[:5])}")


def read_graph_profile(path: str | Path) -> ModelProfile:
    """The profile in ``path`` (a PipeDream ``graph.txt``), in PipeDream's planning order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidRequest(f"no profile at {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidRequest(f"cannot read the profile {path}: {error}") from None
    return graph_profile(parse_graph(text, name=str(path)), source=str(path))


def graph_profile(graph: OperatorGraph, *, source: str = "") -> ModelProfile:
    """PipeDream's states of ``graph`` as a `ModelProfile` (the steps in the module docstring)."""
    for node_id in graph.sources():
        if graph.operators[node_id].description.startswith("Input"):
            graph.remove(node_id)
    for node_id in graph.sinks():
        if graph.operators[node_id].description.startswith("__getitem__"):
            graph.remove(node_id)
    if not graph.operators:
        raise InvalidRequest(f"{source or 'the profile'}: nothing but inputs to place")
    return _StateBuilder(graph).profile(source)


class _StateBuilder:
    """Antichain states of one operator graph (PipeDream's ``antichain_dag``), memoised."""

    def __init__(self, graph: OperatorGraph) -> None:
        self.graph = graph
        self.position = {node_id: i for i, node_id in enumerate(graph.operators)}
        self._ancestors: dict[str, frozenset[str]] = {}
        self._descendants: dict[str, frozenset[str]] = {}
        self._augmented: dict[tuple[str, ...], tuple[str, ...]] = {}

    def ancestors(self, node_id: str) -> frozenset[str]:
        return self._closure(node_id, self.graph.producers, self._ancestors)

    def descendants(self, node_id: str) -> frozenset[str]:
        return self._closure(node_id, self.graph.consumers, self._descendants)

    @staticmethod
    def _closure(
        start: str, step: dict[str, list[str]], memo: dict[str, frozenset[str]]
    ) -> frozenset[str]:
        """Everything reachable from ``start`` along ``step``; iterative, so deep graphs do not
        hit the recursion limit."""
        stack = [start]
        while stack:
            node = stack[-1]
            pending = [o for o in step.get(node, []) if o not in memo]
            if pending:
                stack.extend(pending)
                continue
            stack.pop()
            if node not in memo:
                reach: set[str] = set()
                for other in step.get(node, []):
                    reach.add(other)
                    reach |= memo[other]
                memo[node] = frozenset(reach)
        return memo[start]

    def augment(self, antichain: tuple[str, ...]) -> tuple[str, ...]:
        """The antichain plus the upstream operators whose outputs are read past the cut."""
        key = tuple(sorted(antichain))
        if key not in self._augmented:
            extra: set[str] = set()
            for node in antichain:
                upstream = self.ancestors(node)
                for producer in upstream:
                    if any(
                        c not in upstream and c != node
                        for c in self.graph.consumers.get(producer, [])
                    ):
                        extra.add(producer)
            ordered = sorted(extra, key=self.position.__getitem__)
            self._augmented[key] = (*ordered, *antichain)
        return self._augmented[key]

    def deaugment(self, nodes: Iterable[str]) -> tuple[str, ...]:
        """The operators of ``nodes`` that no other of them depends on, first occurrence kept."""
        members = list(nodes)
        kept: list[str] = []
        for node in members:
            below = self.descendants(node)
            if node not in kept and not any(other in below for other in members):
                kept.append(node)
        return tuple(kept)

    def next_antichains(self, antichain: tuple[str, ...]) -> list[tuple[str, ...]]:
        augmented = self.augment(antichain)
        found = []
        for node in augmented:
            for consumer in self.graph.consumers.get(node, []):
                if consumer in antichain:
                    continue
                if any(other in augmented for other in self.descendants(consumer)):
                    continue
                replaced = [consumer if other == node else other for other in augmented]
                found.append(self.deaugment(replaced))
        return found

    def state_dag(
        self,
    ) -> tuple[list[tuple[str, ...]], dict[tuple[str, ...], list[tuple[str, ...]]]]:
        """Every state (keyed by its sorted antichain) in discovery order, and its successors."""
        first: tuple[str, ...] = (self.graph.sources()[0],)
        key = tuple(sorted(first))
        antichains = {key: first}
        order = [key]
        successors: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
        queue = [first]
        while queue:
            antichain = queue.pop(0)
            key = tuple(sorted(antichain))
            if key in successors:
                continue
            successors[key] = []
            for following in self.next_antichains(antichain):
                following_key = tuple(sorted(following))
                if following_key not in antichains:
                    antichains[following_key] = following
                    order.append(following_key)
                successors[key].append(following_key)
                queue.append(following)
        return [antichains[k] for k in order], successors

    def profile(self, source: str) -> ModelProfile:
        antichains, successors = self.state_dag()
        keys = [tuple(sorted(a)) for a in antichains]
        by_key = dict(zip(keys, antichains, strict=True))
        ordered = [by_key[k] for k in _topological(keys, successors)]
        index = {tuple(sorted(a)): i for i, a in enumerate(ordered)}
        upstream: list[set[int]] = [set() for _ in ordered]
        for i, antichain in enumerate(ordered):  # parents come first in topological order
            for child in successors.get(tuple(sorted(antichain)), []):
                upstream[index[child]] |= upstream[i] | {i}
        layers: list[LayerProfile] = []
        through: list[Totals] = []
        covered_before: set[str] = set()
        for antichain in ordered:
            augmented = self.augment(antichain)
            covered = set(augmented).union(*(self.ancestors(n) for n in augmented))
            through.append(self._totals(covered))
            new = sorted(covered - covered_before, key=self.position.__getitem__)
            covered_before |= covered
            layers.append(self._layer(antichain, augmented, new))
        splits = tuple(frozenset(u) for u in upstream)
        return ModelProfile(tuple(layers), tuple(through), splits, source=source)

    def _totals(self, nodes: Iterable[str]) -> Totals:
        ops = [self.graph.operators[n] for n in sorted(nodes, key=self.position.__getitem__)]
        return Totals(
            compute_s=sum((o.forward_ms + o.backward_ms) * MS for o in ops),
            activation_bytes=sum(o.activation_bytes for o in ops),
            parameter_bytes=sum(o.parameter_bytes for o in ops),
        )

    def _layer(
        self, antichain: tuple[str, ...], augmented: tuple[str, ...], new: list[str]
    ) -> LayerProfile:
        """The state as a layer: the operators it is the first to cover, and its cut's output."""
        ops = [self.graph.operators[n] for n in new]
        return LayerProfile(
            name="+".join(sorted(antichain, key=self.position.__getitem__)),
            description="; ".join(o.description for o in ops) or "(nothing new)",
            forward_s=sum(o.forward_ms for o in ops) * MS,
            backward_s=sum(o.backward_ms for o in ops) * MS,
            activation_bytes=sum(self.graph.operators[n].activation_bytes for n in augmented),
            parameter_bytes=sum(o.parameter_bytes for o in ops),
        )


def _topological(
    keys: list[tuple[str, ...]], successors: dict[tuple[str, ...], list[tuple[str, ...]]]
) -> list[tuple[str, ...]]:
    """Depth-first, roots and children in discovery order, each state before its successors."""
    finished: list[tuple[str, ...]] = []
    marked: set[tuple[str, ...]] = set()
    for root in keys:
        if root in marked:
            continue
        marked.add(root)
        stack = [(root, iter(successors.get(root, [])))]
        while stack:
            node, children = stack[-1]
            child = next((c for c in children if c not in marked), None)
            if child is None:
                stack.pop()
                finished.append(node)
            else:
                marked.add(child)
                stack.append((child, iter(successors.get(child, []))))
    return finished[::-1]
