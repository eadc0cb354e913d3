"""Share keys: the capability that lets processes of different users share data on one host.

kernelfleet has no notion of owners, so "who belongs together" is whoever knows a key. The
first notebook makes one (`new_key`, 192 random bits, printed by ``--share``) and passes it on
(in a message, a job's arguments) to the others, who present it. Nothing ever sends the key
itself over a socket: a peer proves it knows the key by an HMAC of the other side's random
challenge (`proof`), and checks the other side's proof in turn, so neither a process without
the key nor one squatting on a group's address can pass for a member or for the group.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

KEY_BYTES = 24
KEY_CHARACTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")
MIN_KEY_LENGTH = 22
"""128 bits of URL-safe base64: the least a key may hold."""
MAX_KEY_LENGTH = 256
NONCE_BYTES = 32


KEY_PREFIX = "kfs_"
"""Marks a key as one (in logs, in a leaked text) and keeps it from starting with '-', which a
command line would take for an option."""


def new_key() -> str:
    """A fresh share key: `KEY_PREFIX` and 192 random bits, URL-safe base64 (36 characters)."""
    return KEY_PREFIX + secrets.token_urlsafe(KEY_BYTES)


def check_key(key: object) -> str:
    """``key`` if it can be a share key; raises `ValueError` saying what one looks like."""
    if not (
        isinstance(key, str)
        and MIN_KEY_LENGTH <= len(key) <= MAX_KEY_LENGTH
        and set(key) <= KEY_CHARACTERS
    ):
        shown = key if isinstance(key, str) and len(key) <= 40 else f"{str(key)[:37]}..."
        raise ValueError(
            f"share key {shown!r} is not one: a key is {MIN_KEY_LENGTH} to {MAX_KEY_LENGTH} "
            "letters, digits, '_' or '-' (at least 128 bits), as --share alone prints it"
        )
    return key


def new_nonce() -> str:
    """A random challenge, hex."""
    return secrets.token_hex(NONCE_BYTES)


def proof(key: str, role: str, *nonces: str) -> str:
    """What a peer in ``role`` sends to show it knows ``key``: HMAC-SHA256 over the role and
    both sides' challenges (the role keeps one side's proof from serving as the other's)."""
    message = "\0".join((role, *nonces)).encode()
    return hmac.new(key.encode(), message, hashlib.sha256).hexdigest()


def proven(key: str, claimed: object, role: str, *nonces: str) -> bool:
    """Whether ``claimed`` is ``role``'s proof of ``key`` over ``nonces`` (constant time)."""
    return isinstance(claimed, str) and hmac.compare_digest(
        claimed.encode(), proof(key, role, *nonces).encode()
    )


def is_nonce(value: object) -> bool:
    """Whether ``value`` looks like a `new_nonce` (so a peer cannot pick a weak one)."""
    return (
        isinstance(value, str)
        and len(value) == 2 * NONCE_BYTES
        and set(value) <= set("0123456789abcdef")
    )
