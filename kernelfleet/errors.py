"""Domain errors shared by every kernelfleet process.

Each error carries a short machine-readable ``reason`` (kebab-case) and a human ``message``.
Code below the HTTP layer raises these and never imports ``tornado.web``; ``kernelfleet.web``
maps them to ``{"reason", "message"}`` JSON responses in one place.
"""

from __future__ import annotations


class FleetError(Exception):
    """Base class: something the caller asked for cannot be done, and why."""

    reason = "fleet-error"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason


class NotFound(FleetError):
    """An id or name that the fleet does not know."""

    reason = "not-found"


class InvalidRequest(FleetError):
    """Input that is malformed or impossible to honour (bad JSON, bad values)."""

    reason = "invalid-request"


class Conflict(FleetError):
    """The request clashes with the current state (an id already in use, say)."""

    reason = "conflict"


class NoCapacity(FleetError):
    """No host can take what is asked for, now or ever."""

    reason = "no-capacity"


class KernelStartFailed(FleetError):
    """A kernel exited or stayed silent while starting; the message holds its stderr tail."""

    reason = "kernel-start-failed"


class HostUnavailable(FleetError):
    """A host agent did not answer, or answered with an error, when the gateway called it."""

    reason = "host-unavailable"


class KernelDead(FleetError):
    """The kernel's process is gone; it can be restarted or shut down, not used."""

    reason = "kernel-dead"


class GpusUnavailable(FleetError):
    """A host has too few free GPUs right now; waiting (or another host) may help."""

    reason = "gpus-unavailable"


class NotServing(FleetError):
    """This gateway does not serve: a standby of a replicated group, or a member that lost
    its group's majority (another member serves within seconds)."""

    reason = "not-serving"


class HostLimitReached(NoCapacity):
    """A host provider is at its configured maximum number of hosts."""

    reason = "host-limit-reached"


class LedgerInconsistent(FleetError):
    """The GPU ledger broke one of its invariants: a bug, reported with the exact breach."""

    reason = "ledger-inconsistent"


class PermissionDenied(FleetError):
    """The system refused what the fleet asked of it on a caller's behalf (NVML without the
    right to set a GPU's clocks or power limit, say); nothing it was asked stayed changed."""

    reason = "permission-denied"
