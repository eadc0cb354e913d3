"""The one error checkfreq raises to its callers."""

from __future__ import annotations


class CheckpointError(Exception):
    """Checkpointing cannot do what was asked: the folder cannot be written, an object cannot
    be snapshotted, no checkpoint to resume from, a checkpoint that does not fit the namespace.
    Its message is one line, meant for the notebook's user."""
