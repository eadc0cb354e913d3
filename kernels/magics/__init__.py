"""kernelfleet's IPython magics: ``%fleet``, ``%gpus`` / ``%%gpus``, and every bundled tool's.

Every kernelfleet replica kernel loads this extension when it starts; elsewhere (a plain
ipykernel, IPython in a terminal) ``%load_ext kernelfleet.kernels.magics`` does. Loading it runs
`kernelfleet.kernels.magics.registry.load_all`: each entry point of the ``kernelfleet.magics``
group names a callable ``load(ipython) -> None`` that registers its magics, and each is loaded
once per shell; one that fails is reported in one line and the others load all the same.

- ``registry``: the entry-point groups, loading, and what ``%fleet tools`` lists;
- ``fleet``: ``%fleet`` and its subcommands; ``gpus``: ``%gpus N``, ``%gpus`` and ``%%gpus N``;
- ``views``: what they show, as rich HTML with a plain-text fallback;
- ``parsing``: argument parsing that answers bad input with ``UsageError`` and the usage.

The magics are a thin shell over `kernelfleet.client.FleetClient`: parse, call, render. This
module imports nothing heavy, so that loading it costs a kernel's start next to nothing.
"""

from __future__ import annotations

from typing import Any


def load_ipython_extension(ipython: Any) -> None:
    """IPython's hook (``%load_ext``, or the replica kernel at start): load every magic of the
    ``kernelfleet.magics`` group into `ipython`, each once."""
    from kernelfleet.kernels.magics.registry import load_all

    load_all(ipython)
