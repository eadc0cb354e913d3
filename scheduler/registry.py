"""The scheduling policies this package ships, by name: the same as its ``kernelfleet.policies``
entry points (pyproject.toml), found without them. An install made before a policy was added
lists no entry point for it until it is reinstalled; `policy.load_policy` and the simulator's
`resolve_policy` fall back on this table, so a checkout run with ``PYTHONPATH`` knows its own
policies."""

from __future__ import annotations

from kernelfleet.scheduler.packing import PackingPolicy
from kernelfleet.scheduler.policies import BUILTIN_POLICIES
from kernelfleet.scheduler.policy import Policy
from kernelfleet.scheduler.wholehosts import WholeHostsPolicy

SHIPPED_POLICIES: dict[str, type[Policy]] = {
    **BUILTIN_POLICIES,
    PackingPolicy.name: PackingPolicy,
    WholeHostsPolicy.name: WholeHostsPolicy,
}
