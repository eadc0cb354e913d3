"""The fleet's event bus: what happened to kernels, cells, GPUs, replicas and hosts, in order.

The gateway's components call `EventBus.publish` where things happen (a cell started, a host
was lost...). Publishing is cheap and never waits: it numbers the event (``seq``, monotonic
per gateway run), appends it to a bounded ring of recent events (`recent`, `since`) and offers
it to each `Subscription`'s bounded queue. A subscriber that falls behind loses events, never
the gateway's time: once it has room again it first gets one ``events-missed`` event saying how
many it did not get (``data.missed``, ``first_seq``, ``last_seq``; its ``seq`` is ``last_seq``,
so a reconnect with ``since=seq`` asks for no event twice).

Schemas: each `EventType` has a JSON schema (`kernelfleet.gateway.event_schemas`) registered
with a jupyter_events ``EventLogger``. Validating an event costs about 60 µs, several times per
cell, so the bus validates only when built with ``validate=True`` (the tests, and
``GatewayApp.validate_events``); an event that does not match is logged at ERROR and still
published. When the ``EventLogger`` has handlers (``c.EventLogger.handlers`` in the gateway's
config), each event is also emitted through it, and jupyter_events validates it there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from jsonschema import ValidationError  # type: ignore[import-untyped]
from jupyter_events import EventLogger

from kernelfleet.gateway.event_schemas import SCHEMAS, EventType, schema_id
from kernelfleet.gateway.ledger_records import Binding

log = logging.getLogger("kernelfleet.gateway.events")

Event = dict[str, Any]
"""``{"seq", "time", "type", "kernel_id", "host_id", "data"}`` (docs/gateway-contract.md)."""

RING_SIZE = 1000
"""Recent events kept (``GET /api/fleet/events?n=`` asks for at most this many)."""

QUEUE_SIZE = 256
"""Events a subscriber may have waiting before newer ones are dropped for it."""


class Subscription:
    """One subscriber's bounded queue of events (of one kernel, if `kernel_id` is set).

    Iterate it (``async for event in subscription``) to take events in order; `close` ends the
    iteration. Built by `EventBus.subscribe`."""

    def __init__(self, bus: EventBus, kernel_id: str | None, size: int) -> None:
        if size < 2:
            raise ValueError("a subscription needs room for an event and an events-missed")
        self.kernel_id = kernel_id
        self._bus = bus
        self._size = size
        self._queue: deque[Event] = deque()
        self._ready = asyncio.Event()
        self._closed = False
        self._missed: list[int] = []  # first and last seq of the events not queued, then count
        self._backlog = 0  # queued events from the ring, beyond the size
        self.missed = 0
        """Events dropped for this subscriber, in all."""

    def wants(self, event: Event) -> bool:
        return self.kernel_id is None or event["kernel_id"] == self.kernel_id

    def offer(self, event: Event) -> None:
        """Queue `event` if there is room (after an ``events-missed`` owed), else count it
        missed. Never waits."""
        if self._closed or not self.wants(event):
            return
        owed = 1 if self._missed else 0
        if len(self._queue) - self._backlog + owed >= self._size:
            seq = event["seq"]
            self._missed = [self._missed[0], seq, self._missed[2] + 1] if owed else [seq, seq, 1]
            self.missed += 1
            return
        if owed:
            first, last, count = self._missed
            self._missed = []
            notice = self._bus.make(
                EventType.EVENTS_MISSED, {"missed": count, "first_seq": first, "last_seq": last}
            )
            self._queue.append({**notice, "seq": last})
        self._queue.append(event)
        self._ready.set()

    def backlog(self, events: list[Event], gone: tuple[int, int] | None = None) -> None:
        """Queue kept events ahead of live ones (`EventBus.subscribe`), in full: they do not
        count against the queue's size. `gone`: (first, last) seq of events after the
        subscriber's ``since`` that are no longer kept, told first as an ``events-missed``."""
        if gone is not None:
            first, last = gone
            data = {"missed": last - first + 1, "first_seq": first, "last_seq": last}
            self._queue.append({**self._bus.make(EventType.EVENTS_MISSED, data), "seq": last})
        self._queue.extend(events)
        self._backlog = len(self._queue)
        if self._queue:
            self._ready.set()

    def get_nowait(self) -> Event | None:
        """The next queued event, or None."""
        if not self._queue:
            self._ready.clear()
            return None
        self._backlog = max(0, self._backlog - 1)
        return self._queue.popleft()

    def close(self) -> None:
        """Stop receiving; an iteration in progress ends after what is queued."""
        self._closed = True
        self._bus.unsubscribe(self)
        self._ready.set()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> Event:
        while True:
            event = self.get_nowait()
            if event is not None:
                return event
            if self._closed:
                raise StopAsyncIteration
            await self._ready.wait()


class EventBus:
    """Numbers, keeps and fans out fleet events; see the module docstring."""

    def __init__(
        self,
        logger: EventLogger | None = None,
        *,
        validate: bool = False,
        ring_size: int = RING_SIZE,
        queue_size: int = QUEUE_SIZE,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.logger = logger if logger is not None else EventLogger()
        for schema in SCHEMAS.values():
            self.logger.register_event_schema(schema)
        self.validate = validate
        self.queue_size = queue_size
        self._clock = clock
        self._seq = 0
        self._ring: deque[Event] = deque(maxlen=ring_size)
        self._subscribers: list[Subscription] = []
        self.invalid = 0
        """Events that did not match their schema (counted only when validating)."""

    @property
    def ring_size(self) -> int:
        return self._ring.maxlen or 0

    @property
    def last_seq(self) -> int:
        return self._seq

    def make(self, event_type: EventType, data: dict[str, Any] | None = None) -> Event:
        """An event of the bus's clock that is neither numbered nor published (seq 0)."""
        return {
            "seq": 0,
            "time": self._clock(),
            "type": event_type.value,
            "kernel_id": None,
            "host_id": None,
            "data": data or {},
        }

    def publish(
        self,
        event_type: EventType,
        data: dict[str, Any] | None = None,
        *,
        kernel_id: str | None = None,
        host_id: str | None = None,
    ) -> Event:
        """Number `event_type` with its `data`, keep it, and offer it to every subscriber.
        Returns the event. Never waits and never raises for a subscriber."""
        self._seq += 1
        event = {
            "seq": self._seq,
            "time": self._clock(),
            "type": event_type.value,
            "kernel_id": kernel_id,
            "host_id": host_id,
            "data": data or {},
        }
        if self.validate:
            self.check(event)
        self._ring.append(event)
        for subscription in self._subscribers:
            subscription.offer(event)
        if self.logger.handlers:
            self.logger.emit(schema_id=schema_id(event_type), data=event)
        return event

    def check(self, event: Event) -> bool:
        """Whether `event` matches its type's schema; a mismatch is logged and counted."""
        try:
            self.logger.schemas.validate_event(schema_id(EventType(event["type"])), event)
        except (ValidationError, ValueError) as e:
            self.invalid += 1
            log.error("event %s does not match its schema: %s", event.get("type"), e)
            return False
        return True

    def recent(self, n: int = 50, kernel_id: str | None = None) -> list[Event]:
        """The last `n` kept events (of `kernel_id` only, if given), oldest first."""
        if n <= 0:
            return []
        chosen: list[Event] = []
        for event in reversed(self._ring):
            if kernel_id is None or event["kernel_id"] == kernel_id:
                chosen.append(event)
                if len(chosen) == n:
                    break
        chosen.reverse()
        return chosen

    def since(self, seq: int, kernel_id: str | None = None) -> list[Event]:
        """The kept events numbered after `seq` (of `kernel_id` only, if given), oldest first."""
        return [
            event
            for event in self._ring
            if event["seq"] > seq and (kernel_id is None or event["kernel_id"] == kernel_id)
        ]

    def subscribe(self, kernel_id: str | None = None, since: int | None = None) -> Subscription:
        """A new subscription to later events (of `kernel_id` only, if given). With `since`,
        it first gets the kept events after `since`, preceded by an ``events-missed`` when
        some after `since` are no longer kept."""
        subscription = Subscription(self, kernel_id, self.queue_size)
        if since is not None:
            oldest = self._ring[0]["seq"] if self._ring else self._seq + 1
            gone = (since + 1, oldest - 1) if oldest - since > 1 else None
            subscription.backlog(self.since(since, kernel_id), gone)
        self._subscribers.append(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)


def publish_binding(bus: EventBus, event_type: EventType, bindings: Iterable[Binding]) -> None:
    """A ``gpus-committed`` or ``gpus-released`` event for each binding of devices (none for a
    binding of zero GPUs)."""
    for binding in bindings:
        if binding.device_ids:
            data = {
                "devices": list(binding.device_ids),
                "cell_id": binding.cell_id,
                "replica_id": binding.replica_id,
            }
            bus.publish(event_type, data, kernel_id=binding.kernel_id, host_id=binding.host_id)
