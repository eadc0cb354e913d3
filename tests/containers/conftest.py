"""Fixtures for the container runtime tests: a podman service of the test session's own and
the images the tests run, built once per session (and reused across sessions while their
recipe is unchanged).

- `engine_url`: ``podman system service --time=0 unix://<tmp>/podman.sock``, started here and
  stopped at the end (skips when podman is not installed; `.ci/run` installs it);
- `base_image`: Python 3.11 from this Debian machine's own packages
  (``containers/base/host-python-rootfs.sh`` imported), tagged by a hash of the script and the
  installed packages' versions, so it is made again only when they change;
- `kernel_image`: `kernelfleet image build` of it (cached by its recipe hash);
- `pandas_image`: a user's image FROM the kernel image with pandas installed from this machine's
  wheels (its pip's indexes), cached by the hash of its context;
- `container_kernelspecs`: a JUPYTER_PATH with kernelspecs of those images, and of an image
  that does not exist, one that has no kernelfleet (it exits at once) and one with no Python.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import docker
import docker.errors
import pytest

from kernelfleet.kernels.agent.containers.engine import LABEL_STATE_DIR, Engine, list_containers
from kernelfleet.kernels.agent.containers.images import (
    build_kernel_image,
    kernelspec,
    write_kernelspec,
)
from tests.kernels.conftest import REPO_ROOT, host_agent  # noqa: F401 (a fixture)

BASE_SCRIPT = REPO_ROOT / "containers" / "base" / "host-python-rootfs.sh"
BASE_REPO = "localhost/kernelfleet-test-base"
KERNEL_IMAGE = "localhost/kernelfleet-test-kernel:session"
PANDAS_REPO = "localhost/kernelfleet-test-pandas"
NO_PYTHON_IMAGE = "localhost/kernelfleet-test-no-python:1"
MISSING_IMAGE = "localhost/kernelfleet-test-no-such-image:1"
PANDAS_RECIPE = """\
ARG KERNEL
FROM ${KERNEL}
RUN --mount=type=bind,source=wheels,target=/tmp/wheels ["python3", "-m", "pip", "install", \
"--no-index", "--find-links", "/tmp/wheels", "--no-cache-dir", "--root-user-action=ignore", \
"--break-system-packages", "pandas"]
"""

STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
TIMINGS: dict[str, float] = {}
"""Seconds each image took to make (or to find) in this session, printed at its end."""


@contextlib.contextmanager
def podman_service() -> Iterator[str]:
    """``podman system service`` on a socket of its own, stopped on exit; yields its URL."""
    podman = shutil.which("podman")
    if podman is None:
        pytest.skip("podman is not installed (.ci/run installs it)")
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-podman-"))
    socket = folder / "podman.sock"
    log = open(folder / "service.log", "wb")  # noqa: SIM115 (closed below)
    service = subprocess.Popen(
        [podman, "system", "service", "--time=0", f"unix://{socket}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=folder,  # conmon 2.1 writes a file named "oom" into its working folder on OOM kills
    )
    url = f"unix://{socket}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if service.poll() is not None:
                pytest.fail(f"podman's service exited: {(folder / 'service.log').read_text()}")
            try:
                docker.DockerClient(base_url=url, version="auto").close()
                break
            except docker.errors.DockerException:
                if time.monotonic() > deadline:
                    pytest.fail("podman's service did not answer within 30 s")
                time.sleep(0.1)
        yield url
    finally:
        service.terminate()
        try:
            service.wait(20)
        except subprocess.TimeoutExpired:
            service.kill()
            service.wait()
        log.close()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def engine_url() -> Iterator[str]:
    with podman_service() as url:
        yield url


@pytest.fixture(scope="session")
def engine(engine_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engine]:
    engine = Engine(engine_url)
    yield engine
    # A test that failed half-way may leave a replica container (its agent killed before it
    # could stop it): remove those of this session's agents (in its pytest folder, or in a
    # temporary fleet folder removed by now).
    ours = str(tmp_path_factory.getbasetemp())
    client = engine.client()
    for container in list_containers(client, {"label": [LABEL_STATE_DIR]}):
        state_dir = container.labels.get(LABEL_STATE_DIR, "")
        gone = state_dir.startswith(tempfile.gettempdir()) and not os.path.isdir(state_dir)
        if state_dir.startswith(ours) or gone:
            container.remove(force=True)
    engine.close()


def _exists(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def _import(client: docker.DockerClient, tarball: Path | bytes, tag: str) -> None:
    """``docker import`` of a root filesystem tarball, with the usual PATH (an imported image
    has no configuration; the tag is set apart: podman's compatible API ignores the one given
    with the import)."""
    changes = [f"ENV PATH={STANDARD_PATH}"]
    if isinstance(tarball, Path):
        answer = client.api.import_image(src=str(tarball), changes=changes)
    else:
        answer = client.api.import_image_from_data(tarball, changes=changes)
    image_id = json.loads(str(answer).strip().splitlines()[-1])["id"]
    repository, version = tag.rsplit(":", 1)
    client.api.tag(image_id, repository, version)


@pytest.fixture(scope="session")
def base_image(engine: Engine) -> str:
    packages = subprocess.run(
        ["dpkg-query", "-W"], capture_output=True, check=True, text=True
    ).stdout  # the script copies installed packages: their versions decide its output
    recipe = BASE_SCRIPT.read_bytes() + packages.encode() + STANDARD_PATH.encode()
    digest = hashlib.sha256(recipe).hexdigest()[:16]
    tag = f"{BASE_REPO}:{digest}"
    client = engine.client()
    started = time.monotonic()
    if not _exists(client, tag):
        with tempfile.TemporaryDirectory() as folder:
            tarball = Path(folder) / "rootfs.tar"
            subprocess.run([str(BASE_SCRIPT), str(tarball)], check=True, capture_output=True)
            _import(client, tarball, tag)
    TIMINGS["base image (host packages, imported)"] = time.monotonic() - started
    return tag


@pytest.fixture(scope="session")
def kernel_image(engine: Engine, base_image: str) -> str:
    started = time.monotonic()
    built = build_kernel_image(engine, base_image, KERNEL_IMAGE, log=lambda _line: None)
    what = "found" if built.reused else "built"
    TIMINGS[f"kernel image ({what}, recipe hash included)"] = time.monotonic() - started
    return KERNEL_IMAGE


@pytest.fixture(scope="session")
def pandas_image(engine: Engine, kernel_image: str) -> str:
    client = engine.client()
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder:
        context = Path(folder)
        (context / "Containerfile").write_text(PANDAS_RECIPE)
        wheels = context / "wheels"
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "-q", "-w", str(wheels), "pandas"],
            check=True,
            capture_output=True,
        )
        digest = hashlib.sha256(client.images.get(kernel_image).id.encode())
        for wheel in sorted(wheels.iterdir()):
            digest.update(wheel.name.encode())
        tag = f"{PANDAS_REPO}:{digest.hexdigest()[:16]}"
        if not _exists(client, tag):
            client.images.build(
                path=str(context),
                dockerfile="Containerfile",
                tag=tag,
                buildargs={"KERNEL": kernel_image},
                rm=True,
                pull=False,
            )
    for image in client.images.list(name=PANDAS_REPO):  # those of earlier kernel images
        if tag not in image.tags:
            with contextlib.suppress(docker.errors.APIError):  # one a container still uses
                client.images.remove(image.id, force=False)
    TIMINGS["pandas image (FROM the kernel image)"] = time.monotonic() - started
    return tag


@pytest.fixture(scope="session")
def no_python_image(engine: Engine) -> str:
    """An image with a passwd file and nothing else."""
    client = engine.client()
    if not _exists(client, NO_PYTHON_IMAGE):
        data = io.BytesIO()
        with tarfile.open(fileobj=data, mode="w") as tar:
            passwd = b"root:x:0:0:root:/:/nonexistent\n"
            info = tarfile.TarInfo("etc/passwd")
            info.size = len(passwd)
            tar.addfile(info, io.BytesIO(passwd))
        _import(client, data.getvalue(), NO_PYTHON_IMAGE)
    return NO_PYTHON_IMAGE


@pytest.fixture(scope="session")
def container_kernelspecs(
    kernel_image: str, pandas_image: str, base_image: str, no_python_image: str
) -> Iterator[dict[str, str]]:
    """Env for agents (``JUPYTER_PATH``) naming kernelspecs ``kf-c`` (the kernel image, 1 CPU
    and 512 MiB), ``kf-c-pandas``, ``kf-c-missing`` (an image that does not exist),
    ``kf-c-nokernel`` (the base image: Python without kernelfleet, so it exits at once) and
    ``kf-c-nopython``."""
    folder = Path(tempfile.mkdtemp(prefix="kernelfleet-container-specs-"))
    specs = {
        "kf-c": kernelspec(kernel_image, "Container kernel", cpus=1, memory="512m"),
        "kf-c-pandas": kernelspec(pandas_image, "Container kernel · pandas"),
        "kf-c-missing": kernelspec(MISSING_IMAGE, "Missing image"),
        "kf-c-nokernel": kernelspec(base_image, "No kernelfleet"),
        "kf-c-nopython": kernelspec(no_python_image, "No Python"),
    }
    for name, spec in specs.items():
        write_kernelspec(folder / "kernels" / name, spec)
    folder.chmod(0o755)
    yield {"JUPYTER_PATH": str(folder)}
    shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for what, seconds in TIMINGS.items():
        terminalreporter.write_line(f"container images: {what}: {seconds:.1f} s")
