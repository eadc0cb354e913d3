"""How often a pipeline driver asks the gateway about its fleet workers (`next_poll_s`)."""

from __future__ import annotations

from kernelfleet.tools.pipeline.launchers import FleetWorkers, next_poll_s


def test_polls_back_off_while_nothing_changes_and_hurry_after_a_change() -> None:
    least, most = FleetWorkers.REFRESH_MIN_S, FleetWorkers.REFRESH_MAX_S
    waits = [least]
    for _ in range(4):
        waits.append(next_poll_s(waits[-1], False, least, most))
    assert waits == [0.25, 0.5, 1.0, 1.0, 1.0]
    assert next_poll_s(1.0, True, least, most) == least
    assert next_poll_s(0.0, False, least, most) == least  # never below the least
    # an exit still reaches the driver within its notice: the report, then one poll
    assert most < FleetWorkers.notice_s
