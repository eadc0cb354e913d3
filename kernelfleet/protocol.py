"""The wire contract between the gateway, the host agent and the replicas of a kernel.

Everything two kernelfleet processes must spell alike lives here, and nowhere else:

- `Request` / `Reply`: kernelfleet's own Jupyter messages, which the gateway sends a replica
  on the `Channel` each request names, and the reply each one gets;
- `Role`: how the gateway tells each replica what to do with a cell (the Raft log records the
  same roles in its `Proposal` entries);
- `ErrorName`: the ``ename`` of the error replies kernelfleet itself makes;
- `METADATA_KEY` and `CellKey`: kernelfleet's options inside an ``execute_request``'s metadata
  (a cell's GPU request among them) and inside an ``execute_reply``'s content;
- `ConnectionInfo` and `CONNECTION_KEYS`: where a replica listens, as the host agent reports it
  and the gateway connects to it;
- `ReplicaEnv`: the environment variables of a replica's process (the host agent sets them,
  the replica and the code in it read them);
- `KERNEL_TOKEN_PREFIX`: how a kernel-scoped token starts, and `gpus_magic`: the ``%%gpus N``
  line that the gateway and the kernel read alike.

The values are wire strings: replicas of an older release, stored gateway state, tests and
clients rely on them, so they never change (tests/test_protocol.py pins them). Members may be
message values as they are; as keys of a message's dicts, write ``member.value`` (orjson, which
jupyter_client prefers, refuses keys that are not exactly `str`). This module imports nothing
from kernelfleet but its domain errors (which import nothing), so that every process and every
layer may import it.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import Any, TypedDict

from kernelfleet.errors import InvalidRequest


class Channel(enum.StrEnum):
    """The Jupyter channels kernelfleet's own requests travel on.

    Shell messages run on a kernel's main thread, one after the other, after the cell that is
    running; control messages run on the kernel's control thread, even while a cell runs.
    """

    SHELL = "shell"
    CONTROL = "control"


class Request(enum.StrEnum):
    """kernelfleet's requests to a replica; each is answered by its `reply` on its `channel`.

    Every reply's content has ``"status"``: ``"ok"``, or ``"error"`` with ``"ename"`` and
    ``"evalue"`` saying why. What each request carries and its ``"ok"`` reply holds:
    """

    JOIN = "kernelfleet_join_request"
    """Gateway -> every replica of a new group (or a newcomer), on shell: join the kernel's
    Raft group (`JoinContent`). Shell, so that the join runs on the main thread, where the Raft
    log's callbacks then arrive. Answered once the group has a leader:
    ``{"status": "ok", "replica_id"}``."""

    MEMBERSHIP = "kernelfleet_membership_request"
    """Gateway -> one live member, on control: remove, then add, Raft addresses
    (`MembershipContent`), so that a newcomer can join in place of a lost replica. Control, so
    that a running cell does not hold it up. Answered ``{"status": "ok", "members":
    [addresses]}``, the group as that member sees it afterwards."""

    FORGET = "kernelfleet_forget_request"
    """Gateway -> every live replica, on control: these replicas are lost (`ForgetContent`),
    so wait no longer for the state they owed. Answered ``{"status": "ok"}``."""

    STATUS = "kernelfleet_status_request"
    """Operator or test -> a replica, on control, empty content: the replica's view of its
    group. Answered ``{"status": "ok", "replica_id", "execution_count"}`` and, once it joined,
    ``"raft": {"address", "leader", "is_leader", "term", "members", "applied"}`` and
    ``"executors": [[cell_id, attempt, replica_id], ...]`` (who ran which cell)."""

    RELEASE = "kernelfleet_release_request"
    """Gateway -> a replica that holds GPU memory, on control, empty content: another cell got
    its devices, so move its tensors to host memory. Answered ``{"status": "ok", "tensors",
    "modules", "optimizers", "bytes", "seconds", "skipped"}`` (what moved, and what did not)."""

    OUTCOME = "kernelfleet_outcome_request"
    """Gateway -> a live replica, on control: did the cell whose executor was lost complete
    (`OutcomeContent`)? The replica first commits an entry of its own (a SETTLE of that cell),
    so that every entry the lost executor got committed is committed and applied here too, and
    a delta of that cell committed after it never takes effect; then it answers
    ``{"status": "ok", "completed": bool, "execution_count": int | None}``: completed means
    the cell's state delta is in the log, its effects in every replica. ``"error"`` when it
    could not commit in time (no majority): the outcome is unknown."""

    BIND = "kernelfleet_bind_request"
    """Gateway -> every replica of a pooled group (started ahead of any kernel start), on
    shell, as a start takes the group: take on what that start asked for (`BindContent`): its
    ``KERNEL_*`` variables in ``os.environ``, and its working directory. Shell, so that it runs
    between cells, on the main thread. Answered ``{"status": "ok", "cwd"}`` (the directory the
    kernel runs in now)."""

    @property
    def reply(self) -> Reply:
        """The message type of this request's answer."""
        return _REPLIES[self]

    @property
    def channel(self) -> Channel:
        """The channel this request is sent, and answered, on."""
        return _CHANNELS[self]


class Reply(enum.StrEnum):
    """The replies to `Request`, one each (see `Request` for what they hold)."""

    JOIN = "kernelfleet_join_reply"
    MEMBERSHIP = "kernelfleet_membership_reply"
    FORGET = "kernelfleet_forget_reply"
    STATUS = "kernelfleet_status_reply"
    RELEASE = "kernelfleet_release_reply"
    OUTCOME = "kernelfleet_outcome_reply"
    BIND = "kernelfleet_bind_reply"


_REPLIES: dict[Request, Reply] = {request: Reply[request.name] for request in Request}
_CHANNELS: dict[Request, Channel] = {
    Request.JOIN: Channel.SHELL,
    Request.MEMBERSHIP: Channel.CONTROL,
    Request.FORGET: Channel.CONTROL,
    Request.STATUS: Channel.CONTROL,
    Request.RELEASE: Channel.CONTROL,
    Request.OUTCOME: Channel.CONTROL,
    Request.BIND: Channel.SHELL,
}


class JoinContent(TypedDict):
    """The content of `Request.JOIN`."""

    replica_id: str
    """The id the gateway knows the replica by."""
    address: str
    """``ip:port`` where this replica's Raft log listens (the host agent reserved it)."""
    peers: list[str]
    """The Raft addresses of the other members."""
    password: str
    """The group's secret: pysyncobj encrypts the group's traffic with it."""
    store_root: str
    """Where large values of the namespace are stored (the log holds pointers to them)."""
    timeout: float
    """Seconds to wait for the group to have a leader."""
    forget: list[str]
    """Replicas already lost: whatever they owed never comes (see `Request.FORGET`)."""


class MembershipContent(TypedDict):
    """The content of `Request.MEMBERSHIP`: Raft addresses, removed first, then added."""

    remove: list[str]
    add: list[str]


class ForgetContent(TypedDict):
    """The content of `Request.FORGET`."""

    replicas: list[str]
    """Ids of the replicas lost."""


class OutcomeContent(TypedDict):
    """The content of `Request.OUTCOME`."""

    cell_id: str
    """The ``msg_id`` of the cell's ``execute_request``."""
    attempt: int
    """The attempt the lost executor ran (`CellKey.ATTEMPT`)."""


class BindContent(TypedDict):
    """The content of `Request.BIND`."""

    env: dict[str, str]
    """The start's ``KERNEL_*`` variables (any other name is refused: what a process reads
    at its start cannot be set afterwards)."""
    working_dir: str
    """The start's ``KERNEL_WORKING_DIR``; empty: stay where the replica started."""


class Role(enum.StrEnum):
    """What a replica does with a cell: execute it (LEAD), or let another replica (YIELD).

    The gateway sends every cell to every replica of its kernel: with LEAD to the one it chose,
    with YIELD to the others (`CellKey.ROLE`). The executor appends its LEAD to the Raft log
    as a `Proposal`; the first committed LEAD of a cell names the replica that ran it. The
    others answer with an aborted reply and append nothing: their YIELD entries, which nothing
    read, were appended while the LEAD committed and slowed it down.
    A SETTLE (never sent with a cell) closes a cell whose executor was lost (`Request.OUTCOME`):
    whether it completed is what the log holds before it.
    """

    LEAD = "lead"
    YIELD = "yield"
    SETTLE = "settle"


class ErrorName(enum.StrEnum):
    """The ``ename`` of the error ``execute_reply`` messages kernelfleet itself makes.

    The gateway's domain errors (`kernelfleet.errors`) reach a cell under their class name;
    these are the others.
    """

    REPLICA_ISOLATED = "ReplicaIsolated"
    """Replica -> gateway: the replica cannot reach a majority of its group, so it refused the
    cell rather than run it on stale state. The gateway sends the cell to another replica; the
    reply never reaches the client."""

    REPLICA_LOST = "ReplicaLost"
    """Gateway -> client: the replica running the cell was lost; the kernel goes on."""

    KERNEL_UNAVAILABLE = "KernelUnavailable"
    """Gateway -> client: the kernel was shut down or restarted before the cell was sent."""

    GATEWAY_ERROR = "GatewayError"
    """Gateway -> client: the gateway failed to run the cell (a bug; its log says more)."""

    INTERRUPTED = "KeyboardInterrupt"
    """Gateway -> client: the cell was interrupted while it waited in the gateway (IPython's
    name for an interrupted cell, so clients treat both alike)."""

    USAGE_ERROR = "UsageError"
    """Gateway -> client: the cell's leading ``%%gpus N`` line is malformed (`gpus_magic`), so
    it never ran (IPython's name for a magic used wrongly)."""


METADATA_KEY = "kernelfleet"
"""Where kernelfleet's options sit: a dict under this key of an ``execute_request``'s
metadata, and of an ``execute_reply``'s content."""


class CellKey(enum.StrEnum):
    """The keys of kernelfleet's options of one cell (the dict under `METADATA_KEY`)."""

    GPUS = "gpus"
    """Client -> gateway, in the execute_request's metadata: how many GPUs this cell needs (a
    non-negative int; absent: the cell's ``%%gpus N`` line, else the kernel's own count)."""

    ROLE = "role"
    """Gateway -> replica: the cell's `Role` for this replica. Replica -> gateway, in the
    aborted reply of a YIELD: ``"yield"``, so that the gateway drops that reply."""

    EXECUTOR = "executor"
    """Gateway -> replica: the id of the replica sent the cell with LEAD."""

    ATTEMPT = "attempt"
    """Gateway -> replica: how many times the cell was sent again (its replica was lost, or
    isolated, before it began); 0 at first. The YIELD's aborted reply echoes it."""

    SUPERSEDED = "superseded"
    """Gateway -> replica: the replicas earlier attempts of the cell were sent to, which did not
    begin it as far as the gateway knows (lost, or cut off). A LEAD of theirs for the cell does
    not stop this attempt; any other replica's earlier LEAD does (it is the cell's executor)."""

    DEVICES = "devices"
    """Gateway -> replica: the GPU ids bound to the cell on the replica's host (empty for a
    YIELD, and for a cell without GPUs)."""

    DUPLICATE_OF = "duplicate_of"
    """Replica -> gateway, in an aborted reply: the cell (this attempt) already ran on that
    replica, so it does not run again."""


def gpu_request(gpus: int) -> dict[str, Any]:
    """The execute_request metadata with which a client asks for `gpus` GPUs for one cell."""
    return {METADATA_KEY: {CellKey.GPUS.value: gpus}}


GPUS_MAGIC = "%%gpus"
GPUS_MAGIC_USAGE = "usage: %%gpus N  (N: the number of GPUs this cell runs with, 0 or more)"
"""What a bad ``%%gpus`` line is answered with, by the gateway and by the kernel's magic."""

_GPUS_MAGIC = re.compile(re.escape(GPUS_MAGIC) + r"(?:\s(?P<args>.*))?")
_HELP_FLAGS = frozenset({"-h", "--help"})


def gpus_magic(code: str) -> int | None:
    """The GPU count a cell asks for with a leading ``%%gpus N`` line, else None.

    The gateway calls it on every ``execute_request``'s ``code`` to place the cell; the kernel's
    ``%%gpus`` magic calls it on its own line, so both read one syntax. Only the first
    non-blank line counts, and only when it is ``%%gpus`` followed by whitespace or nothing:
    ``N`` is one token of ASCII digits, and a ``#`` starts a comment. ``%%gpus -h`` and
    ``%%gpus --help`` ask the magic for its help, not for GPUs: None. Raises `InvalidRequest`
    (message: what is wrong, then `GPUS_MAGIC_USAGE`) for anything else after ``%%gpus``:
    nothing, a negative number, a non-number, more than one token. Whether some host has N
    GPUs is not checked here.
    """
    first = next((line.strip() for line in code.splitlines() if line.strip()), "")
    found = _GPUS_MAGIC.fullmatch(first)
    if found is None:
        return None
    args = (found.group("args") or "").split("#", 1)[0].split()
    if len(args) == 1 and args[0] in _HELP_FLAGS:
        return None
    if not args:
        raise InvalidRequest(f"%%gpus needs a number of GPUs\n{GPUS_MAGIC_USAGE}")
    if len(args) > 1:
        raise InvalidRequest(f"%%gpus takes one number, not {' '.join(args)!r}\n{GPUS_MAGIC_USAGE}")
    if args[0].startswith("-") and args[0][1:].isascii() and args[0][1:].isdigit():
        raise InvalidRequest(f"%%gpus cannot be negative ({args[0]})\n{GPUS_MAGIC_USAGE}")
    if not args[0].isascii() or not args[0].isdigit():  # "²" is a digit to isdigit, not to int
        raise InvalidRequest(
            f"%%gpus needs a whole number of GPUs, 0 or more, not {args[0]!r}\n{GPUS_MAGIC_USAGE}"
        )
    return int(args[0])


def options_of(container: object) -> dict[str, Any]:
    """The kernelfleet options (the dict under `METADATA_KEY`) of a message's metadata or
    content; empty when there are none, or `container` is not a dict."""
    options = container.get(METADATA_KEY) if isinstance(container, dict) else None
    return options if isinstance(options, dict) else {}


@dataclass(frozen=True)
class ConnectionInfo:
    """Where a kernel replica listens, and the key its messages are signed with.

    The host agent reports it as a dict with `CONNECTION_KEYS` (in each replica model); the
    gateway reads it with `from_dict` and stores it with `to_dict`.
    """

    ip: str
    shell_port: int
    iopub_port: int
    stdin_port: int
    control_port: int
    hb_port: int
    key: str
    transport: str = "tcp"
    signature_scheme: str = "hmac-sha256"

    @classmethod
    def from_dict(cls, info: dict[str, Any]) -> ConnectionInfo:
        """Read a connection dict; keys that are not `CONNECTION_KEYS` are ignored."""
        return cls(**{name: info[name] for name in CONNECTION_KEYS if name in info})

    def to_dict(self) -> dict[str, Any]:
        """The connection dict, keys in `CONNECTION_KEYS` order."""
        return {name: getattr(self, name) for name in CONNECTION_KEYS}

    def url(self, channel: str) -> str:
        """The ZMQ address of a Jupyter channel (``shell``, ``iopub``, ``stdin``, ``control``,
        ``hb``)."""
        port = getattr(self, f"{channel}_port")
        return f"{self.transport}://{self.ip}:{port}"


CONNECTION_KEYS: tuple[str, ...] = (
    "transport",
    "ip",
    "shell_port",
    "iopub_port",
    "stdin_port",
    "control_port",
    "hb_port",
    "key",
    "signature_scheme",
)
"""The keys of a connection dict, in the order the host agent writes them."""


class ReplicaEnv(enum.StrEnum):
    """Environment variables of a replica's process: the host agent sets them for
    the replica, and for the code that runs in it."""

    KERNEL_ID = "KERNELFLEET_KERNEL_ID"
    """The kernel the replica belongs to."""

    REPLICA_ID = "KERNELFLEET_REPLICA_ID"
    """The replica's own id (until a join names it)."""

    REPLICA_DIR = "KERNELFLEET_REPLICA_DIR"
    """A folder of the replica's own on its host (its Raft journal goes there)."""

    RAFT_ADDRESS = "KERNELFLEET_RAFT_ADDRESS"
    """``ip:port`` reserved for the replica's Raft log; the replica holds the port until it
    joins. Set only for a replicated kernel."""

    CACHE_BROKER = "KERNELFLEET_CACHE_BROKER"
    """The unix socket of the host agent's broker of shared caches
    (`kernelfleet.kernels.agent.cache_broker`); absent when the agent could not start it."""

    GPUS = "KERNELFLEET_GPUS"
    """The comma-separated ids of the GPUs bound to the running cell, empty between cells: the
    agent starts a replica with it empty (whatever the agent's own value, which for the agent is
    its virtual GPU count), the replica sets it around each cell
    (`kernelfleet.kernels.replica.gpu_binding`)."""

    GATEWAY_URL = "KERNELFLEET_GATEWAY_URL"
    """The gateway's base URL as the replica's host agent reaches it (the agent's
    ``--gateway``); absent when the agent registers with no gateway."""

    HOST_ADDRESS = "KERNELFLEET_HOST_ADDRESS"
    """The IP address other hosts of the fleet reach the replica's host at (its agent's
    ``--kernel-ip``): where a driver in the kernel listens for its tool workers."""

    KERNEL_TOKEN = "KERNELFLEET_KERNEL_TOKEN"
    """The kernel-scoped token the gateway issued this kernel (`KERNEL_TOKEN_PREFIX`): it reads
    this kernel and the fleet summary, and acts on this kernel only. The fleet token is never
    in a replica's environment."""

    LOG_LEVEL = "KERNELFLEET_REPLICA_LOG_LEVEL"
    """The level of the replica's own log (its ``kernel.log``): ``DEBUG`` follows every cell
    through the log (who led it, whose delta was applied); ``WARNING`` when unset. Set in the
    host agent's environment, it reaches every replica the agent starts."""

    KERNEL_STORE = "KERNELFLEET_KERNEL_STORE"
    """The kernel's own folder in the fleet's object store (``<store root>/kernel-<id>``), which
    every host of the kernel reaches: the replica sets it in its own environment when it joins
    its group, for the code it runs (checkfreq's checkpoints go to its ``checkfreq/``
    subfolder). The object store's collectors leave subfolders other than its objects alone
    while the kernel lives; the whole folder goes when the kernel is shut down."""


KERNEL_TOKEN_PREFIX = "kfk1"
"""A kernel-scoped token reads ``kfk1.<kernel id>.<mac>`` (`kernelfleet.gateway.kernel_tokens`
issues and verifies them); servers tell it from their fleet token by this prefix."""


JOB_TOKEN_PREFIX = "kfj1"
"""A job-scoped token reads ``kfj1.<job id>.<mac>``: it reports the progress of that one job
(``POST /api/fleet/jobs/{id}/progress``) and nothing else (`kernelfleet.gateway.jobs.tokens`)."""


class JobEnv(enum.StrEnum):
    """Environment variables of a background job's process (docs/jobs.md): the gateway chooses
    them, the host agent sets them, `kernelfleet.jobs.sdk` reads them."""

    JOB_ID = "KERNELFLEET_JOB_ID"
    """The job's id (``job-<8 hex>``)."""

    JOB_TOKEN = "KERNELFLEET_JOB_TOKEN"
    """The job-scoped token (`JOB_TOKEN_PREFIX`): it reports this job's progress only."""

    GATEWAY_URL = "KERNELFLEET_GATEWAY_URL"
    """The gateway's base URL as the job's host agent reaches it."""

    STEPS = "KERNELFLEET_JOB_STEPS"
    """The job's step budget: it is complete once it reached it."""

    CHECKPOINT = "KERNELFLEET_JOB_CHECKPOINT"
    """The job's checkpoint folder in the object store (``<root>/job-<id>``): the job saves
    there and resumes from there; it outlives the job's process until the job ends."""

    CACHE_BROKER = "KERNELFLEET_CACHE_BROKER"
    """As `ReplicaEnv.CACHE_BROKER`: a job joins a shared cache as a kernel does."""


# ---- tool workers (`kernelfleet.gateway.tool_workers`, `kernelfleet.kernels.agent.tool_workers`)

TOOL_WORKER_MODULES = frozenset({"kernelfleet.tools.pipeline.worker"})
"""The modules a cell may have the fleet start as tool workers: the tools' own worker programs,
never a module a request makes up. The gateway checks a request, its host agent again."""

TOOL_WORKER_ENV = frozenset({"KERNELFLEET_PIPELINE_TOKEN"})
"""The environment variables a tool-worker request may set (a run's secret); no other."""


def check_tool_module(module: Any) -> str:
    """`module` if it is on `TOOL_WORKER_MODULES`, else `InvalidRequest` naming the list."""
    if module not in TOOL_WORKER_MODULES:
        raise InvalidRequest(
            f"module {module!r} may not be started as a tool worker; allowed: "
            + ", ".join(sorted(TOOL_WORKER_MODULES))
        )
    return str(module)


def check_tool_env(env: Any) -> dict[str, str]:
    """`env` if it maps names of `TOOL_WORKER_ENV` to strings, else `InvalidRequest`."""
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise InvalidRequest("'env' must map names to strings")
    refused = sorted(set(env) - TOOL_WORKER_ENV)
    if refused:
        raise InvalidRequest(
            f"'env' may set only {', '.join(sorted(TOOL_WORKER_ENV))}, not {', '.join(refused)}"
        )
    return dict(env)


def check_tool_args(args: Any, name: str = "args") -> tuple[str, ...]:
    """`args` as a tuple if it is a list of strings, else `InvalidRequest`."""
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise InvalidRequest(f"'{name}' must be a list of strings")
    return tuple(args)
