"""The knobs and the search space: positions, the grid, and which knobs a backend offers."""

import pytest

from kernelfleet.tools.energy.errors import UnknownKnob
from kernelfleet.tools.energy.knobs import Knob, SearchSpace, describe, select

POWER = Knob("power_limit", (100.0, 150.0, 200.0), 200.0)
BATCH = Knob("batch", (8.0, 16.0, 32.0, 64.0), 64.0)


def test_a_space_maps_positions_to_settings_and_back_over_its_whole_grid():
    space = SearchSpace((POWER, BATCH))
    grid = list(space.grid())
    assert space.size == len(grid) == 12
    assert len({tuple(s.items()) for s in grid}) == 12
    assert space.default() == {"power_limit": 200.0, "batch": 64.0}
    assert space.setting([0, 3]) == {"power_limit": 100.0, "batch": 64.0}
    assert all(space.setting(space.positions(s)) == s for s in grid)


def test_a_knob_refuses_unsorted_values_and_a_default_it_cannot_take():
    with pytest.raises(ValueError, match="sorted"):
        Knob("batch", (16.0, 8.0), 8.0)
    with pytest.raises(ValueError, match="default"):
        Knob("batch", (8.0, 16.0), 12.0)


def test_select_keeps_the_canonical_order_and_names_what_the_backend_offers():
    assert select([POWER, BATCH], ["batch", "power_limit"], "b").names == ("power_limit", "batch")
    assert select([POWER, BATCH], None, "b").names == ("power_limit", "batch")
    with pytest.raises(UnknownKnob) as caught:
        select([POWER, BATCH], ["gpu_clock", "batch"], "the replay of v100:x/y/z")
    assert str(caught.value) == (
        "the replay of v100:x/y/z has no knob 'gpu_clock': it offers power_limit, batch"
    )
    assert caught.value._render_traceback_() == [f"UnknownKnob: {caught.value}"]


def test_describe_shows_units():
    assert describe({"batch": 64.0, "power_limit": 150.0}) == "power_limit 150 W, batch 64"
