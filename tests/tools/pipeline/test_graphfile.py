"""Reading PipeDream's ``graph.txt``: the format, bad files, and PipeDream's profile order.

The branching graph's states below were derived by hand from the rules in the module docstring
(and agree with what PipeDream's own ``antichain_dag().topological_sort()`` gives for it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from kernelfleet.errors import InvalidRequest
from kernelfleet.tools.pipeline.graphfile import (
    GraphFormatError,
    graph_profile,
    parse_graph,
    read_graph_profile,
)


def node(
    node_id: str, description: str, forward: float, activation: float, params: float = 0
) -> str:
    return (
        f"{node_id} -- {description} -- forward_compute_time={forward:.3f}, "
        f"backward_compute_time={2 * forward:.3f}, activation_size={activation}, "
        f"parameter_size={params:.3f}"
    )


def edges(*pairs: str) -> list[str]:
    return [f"\t{pair}" for pair in pairs]


# a -> b1 -> b2 -> d and a -> c1 -> d: two branches, so not every state can follow every other
BRANCHING = "\n".join(
    [
        node("node1", "Input0", 0, 7.0),
        node("node2", "a", 1, 100.0),
        node("node3", "b1", 2, 10.0),
        node("node4", "b2", 4, 20.0),
        node("node5", "c1", 8, 40.0),
        node("node6", "d", 16, 1.0, params=1000),
        *edges("node1 -- node2", "node2 -- node3", "node2 -- node5", "node3 -- node4"),
        *edges("node4 -- node6", "node5 -- node6"),
    ]
)


def test_a_chain_keeps_its_order_without_the_input(tmp_path: Path) -> None:
    text = "\n".join(
        [
            node("node3", "Linear", 3, 30.0, params=64),
            node("node1", "Input0", 5, 999.0),
            node("node2", "ReLU", 2, "[8.0; 12.0]"),  # type: ignore[arg-type]
            *edges("node2 -- node3", "node1 -- node2"),
        ]
    )
    path = tmp_path / "graph.txt"
    path.write_text(text + "\n", encoding="utf-8")
    profile = read_graph_profile(path)
    assert [layer.name for layer in profile.layers] == ["node2", "node3"]
    assert profile.is_chain()
    relu, linear = profile.layers
    assert (relu.forward_s, relu.backward_s) == pytest.approx((0.002, 0.004))
    assert relu.activation_bytes == 20.0  # a list of outputs counts as their sum
    assert linear.parameter_bytes == 64
    assert profile.total.compute_s == pytest.approx(0.015)  # the input's time is not placed


def test_branching_graph_states_in_pipedreams_order() -> None:
    profile = graph_profile(parse_graph(BRANCHING))
    names = [layer.name for layer in profile.layers]
    assert names == ["node2", "node5", "node3", "node4", "node3+node5", "node4+node5", "node6"]
    # what each state's cut covers: a, a+c1, a+b1, a+b1+b2, a+b1+c1, a+b1+b2+c1, all
    forward_ms = {"a": 1, "b1": 2, "b2": 4, "c1": 8, "d": 16}
    covered = [["a"], ["a", "c1"], ["a", "b1"], ["a", "b1", "b2"], ["a", "b1", "c1"]]
    covered += [["a", "b1", "b2", "c1"], list(forward_ms)]
    for totals, ops in zip(profile.through, covered, strict=True):
        assert totals.compute_s == pytest.approx(sum(3 * forward_ms[o] for o in ops) / 1000)
    # the cut's output: the antichain plus a, whose tensor is still read past the cut
    assert [layer.activation_bytes for layer in profile.layers] == [
        100.0, 140.0, 110.0, 120.0, 150.0, 160.0, 1.0,
    ]  # fmt: skip
    # a stage may only end at a state after a state it is reachable from
    assert [sorted(s) for s in profile.splits] == [
        [], [0], [0], [0, 2], [0, 1, 2], [0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5],
    ]  # fmt: skip
    assert not profile.is_chain()
    # per-layer figures count each operator once, where it is first covered
    assert sum(layer.compute_s for layer in profile.layers) == pytest.approx(
        profile.total.compute_s
    )
    assert profile.layers[-1].parameter_bytes == 1000


def test_vgg16_profile_order(pipedream_profile: Callable[[str], Path]) -> None:
    path = pipedream_profile("vgg16")
    profile = read_graph_profile(path)
    assert [layer.name for layer in profile.layers] == [f"node{i}" for i in range(2, 42)]
    times = [
        float(f) + float(b)
        for desc, f, b in re.findall(
            r"-- (\S+).*forward_compute_time=(\S+), backward_compute_time=(\S+),",
            path.read_text(encoding="utf-8"),
        )
        if desc != "Input"
    ]
    assert profile.total.compute_s == pytest.approx(sum(times) / 1000)
    # View (node34) reads Size's output and MaxPool's: the Size state keeps MaxPool's tensor
    assert profile.layers[31].name == "node33"
    assert profile.layers[31].activation_bytes == 12845056.0 + 4.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1 -- Input", "line 1: a node line is"),
        ("node1 -- Input -- forward_compute_time=1", "line 1: node node1: expected forward_"),
        (
            "node1 -- X -- forward_compute_time=a, backward_compute_time=1, activation_size=1, "
            "parameter_size=1",
            "line 1: node node1: 'a' is not a number",
        ),
        (
            "node1 -- X -- forward_compute_time=1, backward_compute_time=1, activation_size=-1, "
            "parameter_size=1",
            "line 1: node node1: negative activation",
        ),
        (node("node1", "X", 1, 1) + "\n\tnode1 -- node9", "line 2: edge names 'node9'"),
        (node("node1", "X", 1, 1) + "\n\tnode1 node1", "line 2: an edge line is"),
        (
            node("node1", "X", 1, 1) + "\n" + node("node1", "Y", 1, 1),
            "line 2: node 'node1' appears",
        ),
        (
            "\n".join(
                [node("n1", "X", 1, 1), node("n2", "Y", 1, 1), *edges("n1 -- n2", "n2 -- n1")]
            ),
            "cycle through n1, n2",
        ),
        (
            "\n".join([node("n1", "X", 1, 1), *edges("n1 -- n1"), node("n2", "Y", 1, 1)]),
            "line 3: a node line after the edges",
        ),
        ("\n\n", "no nodes"),
    ],
)
def test_malformed_files_name_the_line_and_reason(text: str, message: str) -> None:
    with pytest.raises(GraphFormatError, match=re.escape(message)) as caught:
        parse_graph(text, name="g.txt")
    assert caught.value.message.startswith("g.txt")


def test_missing_file_and_nothing_but_inputs(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="no profile at"):
        read_graph_profile(tmp_path / "absent.txt")
    only_input = tmp_path / "graph.txt"
    only_input.write_text(node("node1", "Input0", 1, 1) + "\n", encoding="utf-8")
    with pytest.raises(InvalidRequest, match="nothing but inputs"):
        read_graph_profile(only_input)
