"""The kernel image: a user's base image plus kernelfleet's replica kernel (`Containerfile`),
and the kernelspec that runs kernels in it. The same recipe with every one of kernelfleet's
requirements (`fleet_requirements`) makes the fleet image the gateway and host agents of a
Compose deployment run (`deploy/compose.yaml`, docs/deploy.md).

`build_kernel_image` checks the base image (on the engine, never pulled; it must run
``python3`` of this machine's Python version, since the wheels are made here), assembles the
build context (this kernelfleet as a wheel, the packages its kernel imports as wheels resolved
by this machine's pip, with its configured indexes, and pip itself) and builds it through the
engine's API. The image carries the context's content hash as a label (`LABEL_RECIPE`): an image
of that tag and hash already on the engine is used as it is, so a second build of an unchanged
recipe costs the hash alone.
"""

from __future__ import annotations

import base64
import email.parser
import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker.errors
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

import kernelfleet
from kernelfleet.kernels.agent.containers.engine import LABEL_PREFIX, UNREACHABLE, Engine
from kernelfleet.kernels.agent.containers.spec import METADATA_KEY, ContainerSpec

RECIPE = Path(__file__).resolve().parent / "Containerfile"
LABEL_RECIPE = LABEL_PREFIX + "recipe"
KERNEL_ARGV = ["python3", "-m", "kernelfleet.kernels.replica.kernel", "-f", "{connection_file}"]
KERNEL_REQUIREMENTS = (
    "ipykernel",
    "jupyter-client",
    "jupyter-core",
    "pysyncobj",
    "pyzmq",
    "tornado",
    "traitlets",
    "cloudpickle",
    "cryptography",
)
"""What the replica kernel imports besides the standard library (pinned to this machine's
versions, so the image speaks as the fleet does)."""


def fleet_requirements() -> tuple[str, ...]:
    """What the gateway and a host agent import: kernelfleet's own requirements (its installed
    metadata's, extras left out), and the kernel's, since an agent runs kernels beside it."""
    names = list(KERNEL_REQUIREMENTS)
    for line in importlib.metadata.requires("kernelfleet") or []:
        requirement = Requirement(line)
        wanted = requirement.marker is None or requirement.marker.evaluate({"extra": ""})
        if wanted and requirement.name not in names:
            names.append(requirement.name)
    return tuple(names)


_RESOLUTIONS = 5
"""How many times `_make_wheels` resolves before it gives up replacing wheels that do not fit."""
_SKIPPED = {"__pycache__", "node_modules", "labextension", "src", "style"}
"""Folders of the package the kernel never reads (the JupyterLab extension's sources)."""


class ImageBuildError(Exception):
    """The image could not be built; the message names the image and what to do."""


@dataclass(frozen=True)
class BuiltImage:
    tag: str
    image_id: str
    recipe_hash: str
    reused: bool
    """True when an image of this tag and recipe hash was there already (nothing built)."""


def build_kernel_image(
    engine: Engine,
    base: str,
    tag: str,
    *,
    log: Any = print,
    pip: str = sys.executable,
    requirements: tuple[str, ...] = KERNEL_REQUIREMENTS,
) -> BuiltImage:
    """Build (or find) the kernel image `tag` from `base`, with kernelfleet and
    `requirements` (pinned to this machine's versions; `fleet_requirements()` for the fleet
    image); `ImageBuildError` when the base image is missing, has no python3 or another Python
    version, or the build fails."""
    client = engine.client()
    try:
        base_id = client.images.get(base).id
    except docker.errors.ImageNotFound:
        raise ImageBuildError(
            f"base image {base!r} is not on the container engine at {engine.url}; kernelfleet "
            "never pulls: pull, load or import it there first"
        ) from None
    except (docker.errors.DockerException, *UNREACHABLE) as e:
        raise engine.unavailable(e) from e
    base_python = _check_python(client, base)
    with tempfile.TemporaryDirectory(prefix="kernelfleet-image-") as folder:
        context = Path(folder)
        _assemble_context(context, pip, log, requirements, base_python)
        recipe_hash = _content_hash(context, extra=f"{base_id}\n")
        try:
            existing = client.images.get(tag)
        except docker.errors.ImageNotFound:
            existing = None
        if existing is not None and (existing.labels or {}).get(LABEL_RECIPE) == recipe_hash:
            log(f"{tag}: up to date (recipe {recipe_hash[:12]})")
            return BuiltImage(tag, str(existing.id), recipe_hash, reused=True)
        log(f"{tag}: building from {base} (recipe {recipe_hash[:12]})")
        try:
            image, _logs = client.images.build(
                path=str(context),
                dockerfile="Containerfile",
                tag=tag,
                buildargs={"BASE": base},
                labels={LABEL_RECIPE: recipe_hash},
                # The engine keys a cached RUN layer by its text, not by the bind-mounted wheels
                # it installs: a cached layer would hold an older kernelfleet. The recipe hash
                # above is this build's cache.
                nocache=True,
                rm=True,
                forcerm=True,
                pull=False,
            )
        except docker.errors.BuildError as e:
            lines = [str(chunk.get("stream") or chunk.get("error") or "") for chunk in e.build_log]
            tail = "".join(lines)[-3000:]
            raise ImageBuildError(f"building {tag} from {base} failed: {e.msg}\n{tail}") from None
        except docker.errors.APIError as e:
            raise ImageBuildError(f"building {tag} from {base} failed: {e}") from None
        return BuiltImage(tag, str(image.id), recipe_hash, reused=False)


def _check_python(client: Any, base: str) -> str:
    """The full version of `base`'s python3 ('3.11.2'); `ImageBuildError` unless it is this
    machine's major.minor version."""
    wanted = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
    container = client.containers.create(
        base, ["python3", "-c", probe], network_mode="none", entrypoint=""
    )
    try:
        container.start()
        code = container.wait(timeout=120).get("StatusCode")
        out = container.logs(stdout=True, stderr=True)
        if code != 0:
            raise ImageBuildError(
                f"base image {base!r}: python3 exited with {code}: {bytes(out).decode()[-500:]}"
            )
    except docker.errors.APIError as e:
        raise ImageBuildError(
            f"base image {base!r} cannot run python3 ({e.explanation or e}): a kernel image "
            f"needs a base image with Python {wanted} as python3 on its PATH"
        ) from None
    finally:
        container.remove(force=True)
    full = bytes(out).decode(errors="replace").strip()
    found = ".".join(full.split(".")[:2])
    if found != wanted:
        raise ImageBuildError(
            f"base image {base!r} has Python {found}, this machine {wanted}: the kernel's wheels "
            f"are made here, so build on a machine with Python {found}, or pick a base image "
            f"with Python {wanted}"
        )
    return full


def _assemble_context(
    context: Path,
    pip: str,
    log: Any,
    requirements: tuple[str, ...] = KERNEL_REQUIREMENTS,
    base_python: str = "",
) -> None:
    """Containerfile, and wheels/: kernelfleet, `requirements`, pip.whl, each wheel one that
    `base_python` (the base image's version; empty: this machine's) may install."""
    shutil.copy(RECIPE, context / "Containerfile")
    wheels = context / "wheels"
    wheels.mkdir()
    kernelfleet_wheel = write_kernelfleet_wheel(wheels)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in requirements]
    pip_pin = f"pip=={importlib.metadata.version('pip')}"
    log(f"resolving {len(pins)} requirements with this machine's pip")
    _make_wheels(pip, wheels, [*pins, pip_pin], base_python or platform.python_version(), log)
    pip_wheels = sorted(wheels.glob("pip-*.whl"))
    if not pip_wheels:
        raise ImageBuildError("pip made no wheel of pip itself")
    shutil.copy(pip_wheels[0], wheels / "pip.whl")
    own = f"kernelfleet @ file:///tmp/kernelfleet-wheels/{kernelfleet_wheel.name}"
    (wheels / "requirements.txt").write_text("\n".join([own, *pins]) + "\n")


def _make_wheels(pip: str, wheels: Path, pins: list[str], python: str, log: Any) -> None:
    """`pip wheel` of `pins` into `wheels`, for an image whose Python is `python`.

    pip resolves for the Python it runs on, and cannot be told another one's patch version
    when some requirement comes as a source distribution only (pysyncobj). So a wheel whose
    Requires-Python excludes `python` (soupsieve 4.1.3 needs 3.11.5; Debian 12 has 3.11.2) is
    removed, pinned to the newest version that `python` may install, and pip resolves again, up
    to `_RESOLUTIONS` times."""
    constraints: list[str] = []
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as constraints_file:
        for _ in range(_RESOLUTIONS):
            constraints_file.seek(0)
            constraints_file.truncate()
            constraints_file.write("\n".join(constraints) + "\n")
            constraints_file.flush()
            done = subprocess.run(
                [
                    pip,
                    "-m",
                    "pip",
                    "wheel",
                    "--quiet",
                    "--wheel-dir",
                    str(wheels),
                    "--constraint",
                    constraints_file.name,
                    *pins,
                ],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                raise ImageBuildError(
                    f"pip could not make the image's wheels for Python {python}"
                    + (f" (excluding {', '.join(constraints)})" if constraints else "")
                    + f":\n{done.stderr[-3000:]}"
                )
            misfits = [w for w in sorted(wheels.glob("*.whl")) if not _installs_on(w, python)]
            if not misfits:
                return
            for wheel in misfits:
                constraints.append(_newest_for(pip, wheel.name.split("-")[0], python))
                wheel.unlink()
            log(f"resolving again for Python {python}, with {', '.join(constraints)}")
    raise ImageBuildError(
        f"no set of wheels for Python {python} found in {_RESOLUTIONS} resolutions "
        f"(with {', '.join(constraints)}): pick a base image with a newer Python"
    )


def _newest_for(pip: str, name: str, python: str) -> str:
    """``name==version``: the newest wheel of `name` that Python `python` may install, as pip
    finds it (`pip download` honours another Python's version for wheels)."""
    with tempfile.TemporaryDirectory() as folder:
        done = subprocess.run(
            [
                pip,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--python-version",
                python,
                "--dest",
                folder,
                name,
            ],
            capture_output=True,
            text=True,
        )
        found = sorted(Path(folder).glob("*.whl"))
        if done.returncode != 0 or not found:
            raise ImageBuildError(
                f"no wheel of {name} installs on Python {python}: pick a base image with a "
                f"newer Python\n{done.stderr[-2000:]}"
            )
    return f"{name}=={found[0].name.split('-')[1]}"


def _installs_on(wheel: Path, python: str) -> bool:
    """Whether the wheel's Requires-Python (none: any) admits Python `python`."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.HeaderParser().parsestr(archive.read(name).decode())
    requires = metadata.get("Requires-Python")
    return requires is None or SpecifierSet(requires).contains(python, prereleases=True)


def write_kernelfleet_wheel(folder: Path) -> Path:
    """This kernelfleet as a pure-Python wheel in `folder`: its package files (not the
    JupyterLab extension's sources) and its installed metadata's entry points (the magics),
    with no dependencies declared (the image's requirements list them). Made here because the
    project's own build (hatchling, with the extension's Node.js build) is not needed inside a
    kernel."""
    version = kernelfleet.__version__
    name = f"kernelfleet-{version}-py3-none-any.whl"
    dist_info = f"kernelfleet-{version}.dist-info"
    package = Path(kernelfleet.__file__).resolve().parent
    records: list[str] = []
    path = folder / name
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:

        def add(arcname: str, data: bytes) -> None:
            info = zipfile.ZipInfo(arcname, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            wheel.writestr(info, data, zipfile.ZIP_DEFLATED)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append(f"{arcname},sha256={digest.decode()},{len(data)}")

        for file in _package_files(package):
            add("kernelfleet/" + file.relative_to(package).as_posix(), file.read_bytes())
        add(f"{dist_info}/METADATA",
            f"Metadata-Version: 2.1\nName: kernelfleet\nVersion: {version}\n".encode())  # fmt: skip
        add(f"{dist_info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: kernelfleet image build\n"
            b"Root-Is-Purelib: true\nTag: py3-none-any\n")  # fmt: skip
        add(f"{dist_info}/entry_points.txt", _entry_points().encode())
        records.append(f"{dist_info}/RECORD,,")
        wheel.writestr(f"{dist_info}/RECORD", "\n".join(records) + "\n")
    return path


def _package_files(package: Path) -> Iterator[Path]:
    """The files of the package (its linked subpackages followed), in a stable order."""
    for root, folders, files in os.walk(package, followlinks=True):
        folders[:] = sorted(f for f in folders if f not in _SKIPPED and not f.startswith("."))
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                yield Path(root) / name


def _entry_points() -> str:
    """The installed kernelfleet's entry points (empty if it is not installed)."""
    try:
        return importlib.metadata.distribution("kernelfleet").read_text("entry_points.txt") or ""
    except importlib.metadata.PackageNotFoundError:
        return ""


def _content_hash(context: Path, extra: str = "") -> str:
    """sha256 over every file of the context (its path and bytes; wheels by content, whatever
    their time stamps), and `extra` (the base image's id)."""
    digest = hashlib.sha256(extra.encode())
    for file in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(file.relative_to(context).as_posix().encode() + b"\0")
        if file.suffix == ".whl":
            with zipfile.ZipFile(file) as wheel:
                for info in sorted(wheel.infolist(), key=lambda i: i.filename):
                    digest.update(info.filename.encode() + b"\0")
                    digest.update(wheel.read(info))
        else:
            digest.update(file.read_bytes())
    return digest.hexdigest()


def kernelspec(
    image: str, display_name: str, cpus: float | None = None, memory: str | None = None
) -> dict[str, Any]:
    """The kernel.json of a kernelspec that runs the replicated kernel in `image`."""
    settings: dict[str, Any] = {"runtime": "container", "image": image}
    if cpus is not None:
        settings["cpus"] = cpus
    if memory is not None:
        settings["memory"] = memory
    return {
        "argv": KERNEL_ARGV,
        "display_name": display_name,
        "language": "python",
        "interrupt_mode": "signal",
        "metadata": {"debugger": False, METADATA_KEY: settings},
    }


def write_kernelspec(folder: Path, spec: dict[str, Any]) -> Path:
    """Write `spec` as ``folder/kernel.json`` (the folder's name is the kernelspec's)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "kernel.json"
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


__all__ = [
    "BuiltImage",
    "ContainerSpec",
    "ImageBuildError",
    "build_kernel_image",
    "fleet_requirements",
    "kernelspec",
]
