"""The one notice a notebook user gets for a value that does not sync to the other replicas.

Some values cannot be copied to another process: an open file, a socket, a lock, a thread, a
generator, a database connection, a widget (its comm is tied to this kernel process). They
are expected in notebooks, so the notice is one line, one wording, once per name for the
kernel's life (whichever replica ran the cell), and it says plainly what follows: the value
stays on the replica that made it, and a cell run on another replica does not find it.

`NoticeBoard` keeps which names were told. The replica tells a name at two moments:

- at the end of the cell that bound it (IPython's ``post_run_cell``, before the reply), for
  values of the kinds above (`likely_unsyncable`) that indeed fail to pickle: the notice is in
  that cell's output;
- after the cell, when the state sync found any other value it could not pickle (or store):
  the cell's reply is out by then, so front-ends that stop listening at the reply (JupyterLab,
  nbclient) do not show it; the replica's log always does.

A name another replica already reported (its log entry's ``problems``) counts as told.
"""

from __future__ import annotations

import io
import socket
import sqlite3
import threading
import types
from collections.abc import Iterable
from typing import Any

PREFIX = "kernelfleet: "

_KINDS: tuple[tuple[str, tuple[type, ...]], ...] = (
    ("an open file", (io.TextIOWrapper, io.BufferedReader, io.BufferedWriter,
                      io.BufferedRandom, io.FileIO)),
    ("a socket", (socket.socket,)),
    ("a lock", (type(threading.Lock()), type(threading.RLock()), threading.Condition,
                threading.Event, threading.Semaphore)),
    ("a thread", (threading.Thread,)),
    ("a generator", (types.GeneratorType, types.AsyncGeneratorType, types.CoroutineType)),
    ("a database connection", (sqlite3.Connection, sqlite3.Cursor)),
)  # fmt: skip
_WIDGET_MODULES = ("ipywidgets.", "bqplot.", "ipyleaflet.", "ipycanvas.")


def _is_widget(value: Any) -> bool:
    return any(
        isinstance(getattr(cls, "__module__", None), str)
        and cls.__module__.startswith(_WIDGET_MODULES)
        for cls in type(value).__mro__
    )


def what_it_is(value: Any) -> str:
    """A few words for `value`: "a widget", "an open file", ... or "a <type> object"."""
    if _is_widget(value):
        return "a widget"
    for words, kinds in _KINDS:
        if isinstance(value, kinds):
            return words
    return f"a {type(value).__name__} object"


def likely_unsyncable(value: Any) -> bool:
    """Whether `value` is of a kind that never pickles (cheap: a type check, no pickling)."""
    return _is_widget(value) or any(isinstance(value, kinds) for _, kinds in _KINDS)


def notice(name: str, value: Any) -> str:
    """The notice for `name` bound to `value` (the one wording)."""
    return (
        f"{PREFIX}{name} ({what_it_is(value)}) stays on this replica: it cannot be copied to "
        "the kernel's other replicas, so a cell that runs on another one (for a free GPU, or "
        "after this one is lost) will not find it."
    )


class NoticeBoard:
    """Which names the user was told of, for a kernel's life (see the module docstring)."""

    def __init__(self) -> None:
        self._told: set[str] = set()

    def told(self, names: Iterable[str]) -> None:
        """These names were told already (by another replica)."""
        self._told.update(names)

    def tell(self, items: Iterable[tuple[str, Any]]) -> list[str]:
        """The notices of the (name, value) pairs not told yet, each then counted as told."""
        lines = []
        for name, value in items:
            if name not in self._told:
                self._told.add(name)
                lines.append(notice(name, value))
        return lines

    def __contains__(self, name: object) -> bool:
        return name in self._told
