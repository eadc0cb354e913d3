"""``kernelfleet image build``: make a kernel image from a user's base image, and optionally
the kernelspec that offers it in JupyterLab's launcher (docs/containers.md)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from traitlets import Bool, Float, Unicode
from traitlets.config import Application

from kernelfleet import __version__
from kernelfleet.errors import FleetError
from kernelfleet.kernels.agent.containers.engine import Engine, default_engine_url
from kernelfleet.kernels.agent.containers.images import (
    KERNEL_REQUIREMENTS,
    ImageBuildError,
    build_kernel_image,
    fleet_requirements,
    kernelspec,
    write_kernelspec,
)
from kernelfleet.kernels.agent.containers.spec import ContainerSpecError, container_spec


class ImageBuildApp(Application):
    """Build a kernel image (the base image plus kernelfleet's kernel) through the engine."""

    name = "kernelfleet-image-build"
    version = __version__
    description = (
        "Build a kernel image: BASE (with python3 of this machine's version) plus kernelfleet's "
        "replicated kernel, through the Docker Engine API; nothing is pulled. With --kernelspec "
        "NAME, also write the kernelspec that runs kernels in it (JupyterLab's launcher shows "
        "its display name). An image of TAG built from the same recipe is kept as it is. With "
        "--fleet, build the fleet image instead: kernelfleet with all its requirements, which "
        "runs the gateway and host agents (deploy/compose.yaml)."
    )
    examples = (
        "kernelfleet image build --base localhost/pytorch:2.13 --tag localhost/kf-pytorch:2.13 "
        '--kernelspec pytorch-2.13 --display-name "PyTorch 2.13" --memory 16g'
    )
    aliases = {
        "base": "ImageBuildApp.base",
        "tag": "ImageBuildApp.tag",
        "engine": "ImageBuildApp.engine",
        "kernelspec": "ImageBuildApp.kernelspec_name",
        "display-name": "ImageBuildApp.display_name",
        "kernelspec-dir": "ImageBuildApp.kernelspec_dir",
        "cpus": "ImageBuildApp.cpus",
        "memory": "ImageBuildApp.memory",
    }
    flags = {
        "fleet": (
            {"ImageBuildApp": {"fleet": True}},
            "Build the fleet image (gateway and host agent), not a kernel image.",
        )
    }

    base = Unicode(help="The base image (on the engine already; must run python3).").tag(
        config=True
    )
    tag = Unicode(help="The kernel image's tag, e.g. localhost/kf-pytorch:2.13.").tag(config=True)
    engine = Unicode(
        help="The Docker Engine API to build with. Default: $DOCKER_HOST, else Docker's socket."
    ).tag(config=True)
    kernelspec_name = Unicode(
        help="Also write a kernelspec of this name that runs kernels in the image."
    ).tag(config=True)
    display_name = Unicode(help="The kernelspec's display name. Default: the tag.").tag(config=True)
    kernelspec_dir = Unicode(
        help="Where the kernelspec's folder goes. Default: <jupyter data dir>/kernels, where "
        "the gateway and the host agents of this machine find it.",
    ).tag(config=True)
    fleet = Bool(
        False,
        help="Build the fleet image: kernelfleet and every requirement of the gateway and the "
        "host agent (deploy/compose.yaml runs it), not a kernel image.",
    ).tag(config=True)
    cpus = Float(0.0, help="CPUs each kernel's container may use (0: no limit).").tag(config=True)
    memory = Unicode(
        help="Memory each kernel's container may use: '4g', '512m' (empty: no limit)."
    ).tag(config=True)

    def start(self) -> None:
        if not self.base or not self.tag:
            self.log.critical("--base and --tag are both required")
            self.exit(2)
        if self.fleet and self.kernelspec_name:
            self.log.critical("--fleet builds the gateway's and agents' image: no --kernelspec")
            self.exit(2)
        spec = None
        if self.kernelspec_name:
            spec = kernelspec(
                self.tag,
                self.display_name or self.tag,
                cpus=self.cpus or None,
                memory=self.memory or None,
            )
            try:
                container_spec(spec["metadata"], self.kernelspec_name)
            except ContainerSpecError as e:
                self.log.critical("%s", e)
                self.exit(2)
        engine = Engine(self.engine or default_engine_url(), timeout=600)
        try:
            requirements = fleet_requirements() if self.fleet else KERNEL_REQUIREMENTS
            built = build_kernel_image(
                engine, self.base, self.tag, log=self._say, requirements=requirements
            )
        except (ImageBuildError, FleetError) as e:
            self.log.critical("%s", e)
            self.exit(1)
        finally:
            engine.close()
        self._say(
            f"{built.tag}: image {built.image_id[:19]}" + (" (unchanged)" if built.reused else "")
        )
        if spec is not None:
            folder = Path(self.kernelspec_dir or os.path.join(jupyter_data_dir(), "kernels"))
            path = write_kernelspec(folder / self.kernelspec_name, spec)
            self._say(f"kernelspec {self.kernelspec_name!r} written to {path}")

    def _say(self, line: Any) -> None:
        print(line, flush=True)


class ImageApp(Application):
    """Kernel images for the container runtime."""

    name = "kernelfleet-image"
    version = __version__
    description = "Kernel images for the container replica runtime (docs/containers.md)."
    subcommands = {"build": (ImageBuildApp, ImageBuildApp.description)}

    def start(self) -> None:
        if self.subapp is not None:
            self.subapp.start()
            return
        self.print_help()
        self.exit(1)
