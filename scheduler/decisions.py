"""What a policy can decide: a small closed set of frozen values.

A policy never acts; the caller (the gateway, or the simulator) executes the decision. Each
question a policy answers has its own union of possible answers:

- admitting a new kernel (`Policy.admit`): `Placement` | `ScaleOut` | `Queue` | `Reject`
- choosing where a cell runs (`Policy.choose_executor`): `RunOn` | `Migrate` | `ScaleOut` |
  `Queue` | `Reject`
- an autoscaling round (`Policy.autoscale`): `ScaleOut` | `ScaleIn` | `Hold`

`ScaleOut` as an answer to a kernel or a cell means "add hosts, and keep this request waiting
until they are up".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class QueueReason(enum.Enum):
    """Why a request waits; the value is the status line a user sees."""

    WAITING_FOR_GPUS = "waiting for GPUs to be released"
    WAITING_FOR_HOSTS = "waiting for hosts being added"
    SUBSCRIPTION_FULL = "every host is at the cluster subscription ratio"


class RejectReason(enum.Enum):
    """Why a request can never be served as asked."""

    LARGER_THAN_ANY_HOST = "needs more GPUs than any host has"
    TOO_FEW_HOSTS = "needs more distinct hosts than the fleet can have"
    NO_REPLICAS = "the kernel has no replica to run on"


@dataclass(frozen=True)
class Placement:
    """The hosts chosen for a kernel's replicas, in replica order."""

    host_ids: tuple[str, ...]


@dataclass(frozen=True)
class RunOn:
    """Run the cell on the replica on `host_id`, committing the cell's GPUs there."""

    host_id: str


@dataclass(frozen=True)
class Migrate:
    """Move the kernel's replica from `from_host` to `to_host`, then run the cell there."""

    from_host: str
    to_host: str


@dataclass(frozen=True)
class Queue:
    """Keep the request waiting; ask again when capacity changes."""

    reason: QueueReason
    detail: str = ""


@dataclass(frozen=True)
class Reject:
    """Refuse the request now; waiting would not help."""

    reason: RejectReason
    detail: str = ""


@dataclass(frozen=True)
class ScaleOut:
    """Add `hosts` hosts (at least 1), of `kind` (`hostkinds`: ``on-demand`` when the request
    needs a majority replica's host, which a spot host cannot be); None: the autoscaler's
    choice (`hostkinds.kind_to_add`)."""

    hosts: int
    kind: str | None = None


@dataclass(frozen=True)
class ScaleIn:
    """Release these hosts, after moving their replicas elsewhere."""

    host_ids: tuple[str, ...]


@dataclass(frozen=True)
class Hold:
    """Change nothing this round."""


AdmitDecision = Placement | ScaleOut | Queue | Reject
ExecutorDecision = RunOn | Migrate | ScaleOut | Queue | Reject
AutoscaleDecision = ScaleOut | ScaleIn | Hold
