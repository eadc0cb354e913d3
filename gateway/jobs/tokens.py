"""Job-scoped tokens: what a job's process presents to report its progress, and nothing else.

``kfj1.<job id>.<mac>``: an HMAC-SHA256 of the job id keyed by a key derived from the fleet
token, under a label of its own (a job token never verifies as a kernel token, nor the reverse).
Stateless, as kernel tokens are (`kernelfleet.gateway.kernel_tokens`): a restarted gateway with
the same fleet token honours the tokens of the jobs it re-links.
"""

from __future__ import annotations

import hashlib
import hmac

from kernelfleet.protocol import JOB_TOKEN_PREFIX

_KEY_LABEL = b"kernelfleet job-scoped tokens v1"


class JobTokens:
    def __init__(self, fleet_token: str) -> None:
        self._key = hmac.new(fleet_token.encode(), _KEY_LABEL, hashlib.sha256).digest()

    def issue(self, job_id: str) -> str:
        return f"{JOB_TOKEN_PREFIX}.{job_id}.{self._mac(job_id)}"

    def verify(self, token: str, job_id: str) -> bool:
        """Whether `token` is the token of job `job_id`."""
        return hmac.compare_digest(token.encode(), self.issue(job_id).encode())

    def _mac(self, job_id: str) -> str:
        return hmac.new(self._key, job_id.encode(), hashlib.sha256).hexdigest()
