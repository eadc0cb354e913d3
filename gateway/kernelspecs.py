"""The kernelspecs the gateway offers, in the Jupyter REST format, with their resource files."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jupyter_client.kernelspec import KernelSpecManager

from kernelfleet.errors import NotFound


class KernelSpecCatalog:
    """Kernelspecs found by jupyter_client at start-up, optionally restricted to `allowed` names."""

    def __init__(self, default_name: str = "python3", allowed: set[str] | None = None) -> None:
        specs = KernelSpecManager().get_all_specs()
        if allowed:
            specs = {name: spec for name, spec in specs.items() if name in allowed}
        if not specs:
            raise NotFound("no kernelspec is installed (or none of the allowed ones)")
        self._specs: dict[str, dict[str, Any]] = specs
        self.default_name = default_name if default_name in specs else sorted(specs)[0]

    @property
    def names(self) -> list[str]:
        return sorted(self._specs)

    def resolve(self, name: str | None) -> str:
        """The kernelspec name to launch: `name`, or the default when it is empty."""
        if not name:
            return self.default_name
        if name not in self._specs:
            raise NotFound(f"no kernelspec named {name!r}; valid names: {', '.join(self.names)}")
        return name

    def model(self, name: str) -> dict[str, Any]:
        name = self.resolve(name)
        entry = self._specs[name]
        spec = dict(entry["spec"])
        spec.setdefault("metadata", {})
        spec.setdefault("env", {})
        spec.setdefault("interrupt_mode", "signal")
        resources = {}
        for path in sorted(glob.glob(os.path.join(entry["resource_dir"], "*"))):
            filename = os.path.basename(path)
            if filename.startswith("logo-") or filename in ("kernel.js", "kernel.css"):
                key = os.path.splitext(filename)[0] if filename.startswith("logo-") else filename
                resources[key] = f"/kernelspecs/{quote(name)}/{quote(filename)}"
        return {"name": name, "spec": spec, "resources": resources}

    def models(self) -> dict[str, Any]:
        return {"default": self.default_name, "kernelspecs": {n: self.model(n) for n in self.names}}

    def resource_path(self, name: str, filename: str) -> Path:
        """The file `filename` of kernelspec `name`; `NotFound` for anything outside its folder."""
        root = Path(self._specs[self.resolve(name)]["resource_dir"]).resolve()
        path = (root / filename).resolve()
        if path.parent != root or not path.is_file() or filename == "kernel.json":
            raise NotFound(f"kernelspec {name!r} has no resource {filename!r}")
        return path
