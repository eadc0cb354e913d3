"""The waiting cell's notice: shown once, updated at most once a second, cleared without a trace."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kernelfleet.gateway.wait_notice import MIN_INTERVAL, WaitNotice


@dataclass
class Timer:
    due: float
    callback: Callable[[], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Front:
    """What a front-end receives, on a clock the test moves."""

    now: float = 100.0
    sent: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    timers: list[Timer] = field(default_factory=list)

    def notice(self) -> WaitNotice:
        return WaitNotice(
            "kernelfleet-c1",
            lambda msg_type, content: self.sent.append((msg_type, content)),
            clock=lambda: self.now,
            schedule=self.schedule,
        )

    def schedule(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = Timer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        self.now += seconds
        for timer in [t for t in self.timers if t.due <= self.now and not t.cancelled]:
            self.timers.remove(timer)
            timer.callback()

    def types(self) -> list[str]:
        return [msg_type for msg_type, _ in self.sent]

    def texts(self) -> list[str]:
        return [content["data"]["text/plain"] for _, content in self.sent if "data" in content]


def test_first_text_is_a_transient_display_after_a_busy_status():
    front = Front()
    front.notice().show("waiting for 1 GPU")
    assert front.types() == ["status", "display_data"]
    assert front.sent[0][1] == {"execution_state": "busy"}
    assert front.sent[1][1]["transient"] == {"display_id": "kernelfleet-c1"}


def test_the_same_text_is_never_sent_again():
    front = Front()
    notice = front.notice()
    for _ in range(50):
        notice.show("waiting for 1 GPU")
        front.advance(0.5)
    assert front.types() == ["status", "display_data"]


def test_changes_come_at_most_once_a_second_and_the_latest_wins():
    front = Front()
    notice = front.notice()
    notice.show("3 cells ahead")
    for step in range(19):  # a new text every twentieth of a second, for almost a second
        front.advance(MIN_INTERVAL / 20)
        notice.show(f"{step} cells ahead")
    assert front.texts() == ["3 cells ahead"], "held until a second has passed"
    front.advance(MIN_INTERVAL / 10)
    assert front.texts() == ["3 cells ahead", "18 cells ahead"]
    assert front.types()[-1] == "update_display_data"
    front.advance(MIN_INTERVAL * 2)
    notice.show("waited 2 s")  # after a quiet second: at once
    assert front.texts()[-1] == "waited 2 s"
    assert len(front.sent) == 4


def test_a_held_text_that_is_undone_is_not_sent():
    front = Front()
    notice = front.notice()
    notice.show("a")
    front.advance(0.1)
    notice.show("b")
    notice.show("a")
    front.advance(MIN_INTERVAL)
    assert front.texts() == ["a"]


def test_clear_removes_the_notice_and_drops_what_was_held():
    front = Front()
    notice = front.notice()
    assert notice.clear() is False, "nothing shown: nothing sent"
    assert front.sent == []
    notice.show("waiting")
    front.advance(0.1)
    notice.show("waited 0.1 s")
    assert notice.clear() is True
    front.advance(MIN_INTERVAL)
    assert front.types() == ["status", "display_data", "clear_output"]
    assert front.sent[-1][1] == {"wait": False}
    assert notice.shown is None
    notice.show("waiting again")  # a cell sent again waits anew: a new display
    assert front.types()[-2:] == ["status", "display_data"]
