"""What a container kernelspec asks for, read from ``metadata.kernelfleet`` of its kernel.json:

```json
{"argv": ["python3", "-m", "kernelfleet.kernels.replica.kernel", "-f", "{connection_file}"],
 "metadata": {"kernelfleet": {"runtime": "container", "image": "localhost/kf-kernel:1",
                              "cpus": 2, "memory": "4g"}}}
```

``runtime`` is ``"process"`` (the default: no container) or ``"container"``; ``image`` is
required for a container; ``cpus`` (a positive number) and ``memory`` (bytes, or a number with
``k``, ``m``, ``g`` suffix) are optional limits. Bad values raise `ContainerSpecError` naming the
kernelspec, the field and the value.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kernelfleet.errors import InvalidRequest

METADATA_KEY = "kernelfleet"
RUNTIMES = ("process", "container")
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?", re.IGNORECASE)
_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}
MIN_MEMORY = 6 * 2**20  # the least the engines accept


class ContainerSpecError(InvalidRequest):
    """A kernelspec's container settings are wrong."""


@dataclass(frozen=True)
class ContainerSpec:
    """The container settings of one kernelspec."""

    image: str
    cpus: float | None = None
    """CPUs the container may use (CFS quota); None: no limit."""
    memory: int | None = None
    """Bytes of memory (and of memory plus swap) the container may use; None: no limit."""

    @property
    def nano_cpus(self) -> int | None:
        return None if self.cpus is None else int(self.cpus * 1e9)

    def describe_memory(self) -> str:
        return "no limit" if self.memory is None else f"{self.memory / 2**20:g} MiB"


def runtime_of(metadata: dict[str, Any] | None, kernelspec: str) -> str:
    """``"process"`` or ``"container"``: which runtime a kernelspec's metadata asks for."""
    settings = (metadata or {}).get(METADATA_KEY) or {}
    if not isinstance(settings, dict):
        raise ContainerSpecError(
            f"kernelspec {kernelspec!r}: metadata.kernelfleet must be an object, not {settings!r}"
        )
    runtime = settings.get("runtime", "process")
    if runtime not in RUNTIMES:
        raise ContainerSpecError(
            f"kernelspec {kernelspec!r}: metadata.kernelfleet.runtime must be one of "
            f"{', '.join(RUNTIMES)}, not {runtime!r}"
        )
    return str(runtime)


def container_spec(metadata: dict[str, Any] | None, kernelspec: str) -> ContainerSpec | None:
    """The container settings of a kernelspec, or None when it runs kernels as processes."""
    if runtime_of(metadata, kernelspec) != "container":
        return None
    settings = (metadata or {})[METADATA_KEY]
    where = f"kernelspec {kernelspec!r}: metadata.kernelfleet"
    image = settings.get("image")
    if not isinstance(image, str) or not image.strip() or any(c.isspace() for c in image):
        raise ContainerSpecError(f"{where}.image must name an image (no spaces), not {image!r}")
    cpus = settings.get("cpus")
    if cpus is not None and (
        isinstance(cpus, bool) or not isinstance(cpus, int | float) or not 0 < cpus <= 4096
    ):
        raise ContainerSpecError(f"{where}.cpus must be a positive number of CPUs, not {cpus!r}")
    return ContainerSpec(
        image=image, cpus=None if cpus is None else float(cpus), memory=_memory(settings, where)
    )


def _memory(settings: dict[str, Any], where: str) -> int | None:
    value = settings.get("memory")
    if value is None:
        return None
    amount: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        amount = value
    elif isinstance(value, str):
        match = _MEMORY.fullmatch(value.strip())
        if match:
            amount = int(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if amount is None or amount < MIN_MEMORY:
        raise ContainerSpecError(
            f"{where}.memory must be bytes or a size such as '512m' or '4g' "
            f"(at least 6m), not {value!r}"
        )
    return amount
