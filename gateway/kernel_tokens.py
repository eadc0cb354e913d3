"""Kernel-scoped tokens: what a kernel's code presents to the gateway, never the fleet token.

A kernel token reads ``kfk1.<kernel id>.<mac>``: the mac is an HMAC-SHA256 of the kernel id,
keyed by a key derived from the fleet token. The gateway keeps nothing per token (stateless),
so a restarted gateway with the same fleet token honours the tokens its predecessor issued, and
a token dies with its kernel: the gateway accepts it only while the kernel exists
(`KernelService.kernel_of_token`). Rotating the fleet token revokes every kernel token.

`KernelTokens` only issues and verifies; what a valid token may do is each handler's
``kernel_access`` (`kernelfleet.web.TokenAuthMixin`). The launcher issues a kernel's token when
it starts a replica, and the host agent puts it in the replica's environment
(`kernelfleet.protocol.ReplicaEnv.KERNEL_TOKEN`).
"""

from __future__ import annotations

import hashlib
import hmac

from kernelfleet.protocol import KERNEL_TOKEN_PREFIX

_KEY_LABEL = b"kernelfleet kernel-scoped tokens v1"
"""What the fleet token signs to make the key: tokens are never the fleet token's HMAC of
something a kernel could choose to be signed elsewhere."""


class KernelTokens:
    """Issues and verifies the tokens of kernels, with a key derived from `fleet_token`."""

    def __init__(self, fleet_token: str) -> None:
        self._key = hmac.new(fleet_token.encode(), _KEY_LABEL, hashlib.sha256).digest()

    def issue(self, kernel_id: str) -> str:
        """The token of kernel `kernel_id` (the same one every time)."""
        if "." in kernel_id or not kernel_id:
            raise ValueError(f"not a kernel id: {kernel_id!r}")
        return f"{KERNEL_TOKEN_PREFIX}.{kernel_id}.{self._mac(kernel_id)}"

    def verify(self, token: str) -> str | None:
        """The id of the kernel `token` was issued for; None when it was not issued with this
        key (forged, mangled, or signed with another fleet token). Whether that kernel still
        exists is the caller's question."""
        prefix, _, rest = token.partition(".")
        kernel_id, _, mac = rest.rpartition(".")
        if prefix != KERNEL_TOKEN_PREFIX or not kernel_id or "." in kernel_id:
            return None
        if not hmac.compare_digest(mac.encode(), self._mac(kernel_id).encode()):
            return None
        return kernel_id

    def _mac(self, kernel_id: str) -> str:
        return hmac.new(self._key, kernel_id.encode(), hashlib.sha256).hexdigest()
