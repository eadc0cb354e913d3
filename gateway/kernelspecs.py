"""The kernelspecs the gateway offers, in the Jupyter REST format, with their resource files.

Beside each installed kernelspec that replicates (its replica kernel binds GPUs per cell), the
catalog offers one *GPU variant* per count in `gpu_counts`: ``python3-1gpu`` ("Python 3
(ipykernel) · 1 GPU"), ``python3-2gpu`` ("… · 2 GPUs"), and so on. Starting a variant starts
its base kernelspec with that count as the kernel's default GPUs per cell (what ``KERNEL_GPUS``
sets; the variant wins over a ``KERNEL_GPUS`` in the request). The list a client reads (JupyterLab's
launcher) holds only the counts that fit on the largest host at listing time, hosts the
autoscaler could add included; by name, every configured variant can be started (a notebook
saved with one opens while the fleet is smaller; its cells then wait or fail as any
oversized request does). An installed kernelspec of a variant's name wins over the variant.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jupyter_client.kernelspec import KernelSpecManager

from kernelfleet.errors import NotFound

GPU_VARIANT_KEY = "kernelfleet"
"""Where a GPU variant's model says what it is: ``spec.metadata.kernelfleet``
(``{"gpus": n, "variant_of": base}``)."""


def container_kernelspecs() -> dict[str, str]:
    """The installed kernelspecs whose replicated kernel runs in a container
    (``metadata.kernelfleet.runtime == "container"``, as `kernelfleet image build
    --kernelspec` writes them), each mapped to itself: the hosts launch the same kernelspec,
    which names the image (docs/containers.md)."""
    found = {}
    for name, spec in KernelSpecManager().get_all_specs().items():
        settings = (spec.get("spec", {}).get("metadata") or {}).get(GPU_VARIANT_KEY)
        if isinstance(settings, dict) and settings.get("runtime") == "container":
            found[name] = name
    return found


def variant_name(base: str, gpus: int) -> str:
    """The kernelspec name of `base` with `gpus` GPUs per cell: ``python3-2gpu``."""
    return f"{base}-{gpus}gpu"


def variant_display_name(display_name: str, gpus: int) -> str:
    """What the launcher shows: ``Python 3 (ipykernel) · 2 GPUs``."""
    return f"{display_name} · {gpus} GPU{'' if gpus == 1 else 's'}"


@dataclass(frozen=True)
class Launch:
    """What starting a kernelspec means: the installed kernelspec `base` and, for a GPU
    variant, its GPUs per cell (None: the request's ``KERNEL_GPUS`` decides)."""

    base: str
    gpus: int | None = None


class KernelSpecCatalog:
    """Kernelspecs found by jupyter_client at start-up, optionally restricted to `allowed` names,
    and the GPU variants of the `gpu_bases` among them (see the module docstring).

    `largest_host` is called each time the list is read: the GPUs of the largest host a cell
    could run on now (0: list no variant). Without it every variant is listed.
    """

    def __init__(
        self,
        default_name: str = "python3",
        allowed: set[str] | None = None,
        *,
        gpu_bases: Iterable[str] = (),
        gpu_counts: Iterable[int] = (),
        largest_host: Callable[[], int] | None = None,
    ) -> None:
        specs = KernelSpecManager().get_all_specs()
        if allowed:
            specs = {name: spec for name, spec in specs.items() if name in allowed}
        if not specs:
            raise NotFound("no kernelspec is installed (or none of the allowed ones)")
        self._specs: dict[str, dict[str, Any]] = specs
        self.default_name = default_name if default_name in specs else sorted(specs)[0]
        self._variants: dict[str, Launch] = {
            variant_name(base, gpus): Launch(base, gpus)
            for base in sorted(set(gpu_bases) & set(specs))
            for gpus in sorted(set(gpu_counts))
            if variant_name(base, gpus) not in specs
        }
        self._largest_host = largest_host

    @property
    def names(self) -> list[str]:
        """Every name `resolve` accepts: installed kernelspecs and all configured variants."""
        return sorted([*self._specs, *self._variants])

    def listed_names(self) -> list[str]:
        """The names a client's list shows: the installed ones, and the variants whose GPU
        count fits on the largest host now."""
        largest = self._largest_host() if self._largest_host is not None else None
        variants = [
            name
            for name, launch in self._variants.items()
            if largest is None or (launch.gpus or 0) <= largest
        ]
        return sorted([*self._specs, *variants])

    def resolve(self, name: str | None) -> str:
        """The kernelspec name to launch: `name`, or the default when it is empty."""
        if not name:
            return self.default_name
        if name not in self._specs and name not in self._variants:
            raise NotFound(f"no kernelspec named {name!r}; valid names: {', '.join(self.names)}")
        return name

    def launch(self, name: str | None) -> Launch:
        """What starting kernelspec `name` (resolved as `resolve` does) means."""
        name = self.resolve(name)
        return self._variants.get(name, Launch(name))

    def model(self, name: str) -> dict[str, Any]:
        name = self.resolve(name)
        launch = self.launch(name)
        entry = self._specs[launch.base]
        spec = dict(entry["spec"])
        spec["metadata"] = dict(spec.get("metadata") or {})
        spec.setdefault("env", {})
        spec.setdefault("interrupt_mode", "signal")
        if launch.gpus is not None:
            spec["display_name"] = variant_display_name(spec["display_name"], launch.gpus)
            spec["metadata"][GPU_VARIANT_KEY] = {"gpus": launch.gpus, "variant_of": launch.base}
        resources = {}
        for path in sorted(glob.glob(os.path.join(entry["resource_dir"], "*"))):
            filename = os.path.basename(path)
            if filename.startswith("logo-") or filename in ("kernel.js", "kernel.css"):
                key = os.path.splitext(filename)[0] if filename.startswith("logo-") else filename
                resources[key] = f"/kernelspecs/{quote(name)}/{quote(filename)}"
        return {"name": name, "spec": spec, "resources": resources}

    def models(self) -> dict[str, Any]:
        return {
            "default": self.default_name,
            "kernelspecs": {n: self.model(n) for n in self.listed_names()},
        }

    def resource_path(self, name: str, filename: str) -> Path:
        """The file `filename` of kernelspec `name` (a variant's are its base's); `NotFound`
        for anything outside its folder."""
        base = self.launch(name).base
        root = Path(self._specs[base]["resource_dir"]).resolve()
        path = (root / filename).resolve()
        if path.parent != root or not path.is_file() or filename == "kernel.json":
            raise NotFound(f"kernelspec {name!r} has no resource {filename!r}")
        return path
