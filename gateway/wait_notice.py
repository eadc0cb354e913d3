"""The notice a cell shows while it waits in the gateway ("waiting for 1 GPU ... — 0 cells ahead").

Jupyter front-ends keep every output a cell receives, and save it in the notebook. The notice
is not output of the cell, so it is a transient display, removed before the cell runs:

- the first text is a ``display_data`` with a ``transient.display_id`` (after a ``busy``
  status, so the front-end shows the cell as running); each later text updates that display
  in place (``update_display_data``);
- the same text is never sent twice, and a new text is sent at most once per
  `MIN_INTERVAL`: one that comes sooner is held and sent when the interval is up (only the
  latest of several is);
- `clear` removes it with ``clear_output``: the gateway calls it when the cell is sent to its
  replica (nothing of the cell's own has reached the front-end yet) and when it ends without
  running. A front-end then holds no trace of it, and a saved notebook neither.

A waiting cell thus gets ``busy``, one ``display_data``, at most one update a second while its
text changes, and one ``clear_output``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

MIN_INTERVAL = 1.0
"""Seconds between two messages of one notice (the first and the clearing excepted)."""


class Timer(Protocol):
    def cancel(self) -> None: ...


Publish = Callable[[str, dict[str, Any]], None]
"""Sends an IOPub message (type, content) to the cell's client, as a child of the cell."""
Schedule = Callable[[float, Callable[[], None]], Timer]
"""Runs a callback after that many seconds (`asyncio.AbstractEventLoop.call_later`)."""


class WaitNotice:
    """One waiting cell's notice (see the module docstring). Used on the event loop's thread;
    `clock` and `schedule` default to ``time.monotonic`` and the running loop's ``call_later``."""

    def __init__(
        self,
        display_id: str,
        publish: Publish,
        *,
        min_interval: float = MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        schedule: Schedule | None = None,
    ) -> None:
        self.display_id = display_id
        self._publish = publish
        self._min_interval = min_interval
        self._clock = clock
        self._schedule = schedule
        self._shown: str | None = None
        """The text the front-end shows now; None while nothing is shown."""
        self._held: str | None = None
        self._timer: Timer | None = None
        self._sent_at = 0.0

    @property
    def shown(self) -> str | None:
        """The text on display now (None: none)."""
        return self._shown

    def show(self, text: str) -> None:
        """Make `text` the notice: shown now, or when `MIN_INTERVAL` since the last message is
        up; nothing if it is what is shown already."""
        if text == self._shown:
            self._held = None
            return
        if self._shown is None:
            self._publish("status", {"execution_state": "busy"})
            self._send("display_data", text)
            return
        wait = self._sent_at + self._min_interval - self._clock()
        if wait <= 0:
            self._send("update_display_data", text)
            return
        self._held = text
        if self._timer is None:
            schedule = self._schedule or asyncio.get_running_loop().call_later
            self._timer = schedule(wait, self._send_held)

    def clear(self) -> bool:
        """Remove the notice from the front-end (``clear_output``) if one is shown, and forget
        it: a later `show` starts a new one. Whether anything was sent."""
        self.cancel()
        if self._shown is None:
            return False
        self._shown = None
        self._publish("clear_output", {"wait": False})
        return True

    def cancel(self) -> None:
        """Send nothing more (what is held is dropped); the front-end keeps what it shows."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held = None

    def _send_held(self) -> None:
        self._timer = None
        held, self._held = self._held, None
        if held is not None and self._shown is not None and held != self._shown:
            self._send("update_display_data", held)

    def _send(self, msg_type: str, text: str) -> None:
        content = {
            "data": {"text/plain": text},
            "metadata": {},
            "transient": {"display_id": self.display_id},
        }
        self._publish(msg_type, content)
        self._shown = text
        self._sent_at = self._clock()
