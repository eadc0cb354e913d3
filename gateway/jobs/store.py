"""``<state_dir>/jobs.json``: the jobs, their leases and progress, and the job policy, so a
restarted gateway re-links the jobs still running on their hosts and resumes the others.

Written after every change, atomically, as ``kernels.json`` is (`kernelfleet.gateway.store`); a
file that cannot be read is `StateUnreadable` and stops the gateway (exit 2), naming it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kernelfleet.gateway.jobs.records import JobRecord
from kernelfleet.gateway.store import (
    FORMAT_VERSION,
    StateUnreadable,
    read_json_list,
    write_json_atomically,
)


class JobStore:
    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / "jobs.json"

    def save(self, jobs: list[JobRecord], policy: str) -> None:
        data = {"version": FORMAT_VERSION, "policy": policy, "jobs": [j.stored() for j in jobs]}
        write_json_atomically(self.path, data)

    def load(self) -> tuple[list[JobRecord], str | None]:
        """The stored jobs and policy (``[], None`` with no file)."""
        stored = read_json_list(self.path, "jobs")
        try:
            jobs = [JobRecord.from_stored(job) for job in stored]
            policy: Any = json.loads(self.path.read_text()).get("policy") if stored else None
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise StateUnreadable(
                f"the state file {self.path} holds a job that cannot be read ({e!r}): restore "
                "it, or remove it to start with no jobs"
            ) from e
        return jobs, policy if isinstance(policy, str) else None
