"""Other projects' kernel test suites, fetched and run as their authors run them, in a pytest
of their own, against whichever kernel the ``python3`` kernelspec of the run names.

- `ipykernel_tests`: ipykernel's ``tests/test_message_spec.py`` and ``tests/test_subshells.py``
  from the sdist of the installed ipykernel (``pip download``), cached; never kept in this
  repository. Their ``conftest.py`` (fixtures for in-process kernels these two files do not
  use, and a pytest-asyncio import) is left out.
- `run_suite`: one pytest run, in its own folder and config (none of this project's settings),
  its outcomes read back from its JUnit XML.
- `bridge_kernelspec`: a ``python3`` kernelspec that starts ``kernelfleet bridge`` to a gateway,
  written by ``kernelfleet bridge install`` as a user would.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import ipykernel
import pytest

SUITE_FILES = ("__init__.py", "utils.py", "test_message_spec.py", "test_subshells.py")
CACHE = Path(os.environ.get("KERNELFLEET_SUITES_CACHE", Path.home() / ".cache/kernelfleet-suites"))
RUN_CONFIG = """[pytest]
timeout = 120
addopts = -p no:randomly -p no:cacheprovider -q
"""


def ipykernel_tests(cache: Path = CACHE) -> Path:
    """A folder holding ipykernel's own ``tests`` package (the files in `SUITE_FILES`) for the
    installed version; skips the calling test, saying why, if the sdist cannot be had."""
    version = ipykernel.__version__
    root = cache / f"ipykernel-{version}"
    if all((root / "tests" / name).is_file() for name in SUITE_FILES):
        return root
    downloads = cache / "sdists"
    downloads.mkdir(parents=True, exist_ok=True)
    sdist = downloads / f"ipykernel-{version}.tar.gz"
    if not sdist.is_file():
        fetch = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "ipykernel",
             f"ipykernel=={version}", "-d", str(downloads)],
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        if fetch.returncode != 0 or not sdist.is_file():
            pytest.skip(f"ipykernel {version}'s sdist could not be downloaded (offline?): "
                        f"{fetch.stderr.strip()[-300:]}")  # fmt: skip
    (root / "tests").mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as archive:
        for name in SUITE_FILES:
            try:
                member = archive.extractfile(f"ipykernel-{version}/tests/{name}")
            except KeyError:
                member = None
            if member is None:
                pytest.skip(f"ipykernel {version}'s sdist has no tests/{name}")
            (root / "tests" / name).write_bytes(member.read())
    return root


def run_suite(folder: Path, files: list[str], env: dict[str, str], report: Path) -> dict[str, str]:
    """Run pytest on `files` (relative to `folder`) with `env`; return each test's outcome
    ("passed", "failed", "error" or "skipped") by its id ``module.Class::name`` (JUnit's)."""
    (folder / "pytest.ini").write_text(RUN_CONFIG)
    subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(folder / "pytest.ini"), "--rootdir",
         str(folder), f"--junitxml={report}", *files],
        cwd=folder, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        outcome = "passed"
        for kind in ("failure", "error", "skipped"):
            if case.find(kind) is not None:
                outcome = {"failure": "failed"}.get(kind, kind)
        outcomes[test_id] = outcome
    return outcomes


def bridge_kernelspec(prefix: Path, gateway_url: str, token: str) -> dict[str, str]:
    """Install a ``python3`` kernelspec that bridges to `gateway_url` under `prefix`, with
    ``kernelfleet bridge install``; return the environment whose jupyter_client finds it."""
    env = {**os.environ, "KERNELFLEET_TOKEN": token}
    subprocess.run(
        [sys.executable, "-m", "kernelfleet", "bridge", "install", "--gateway-url", gateway_url,
         "--name", "python3", "--prefix", str(prefix)],
        env=env, check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    env.pop("KERNELFLEET_TOKEN")  # the kernelspec carries it
    return {**env, "JUPYTER_PATH": str(prefix / "share" / "jupyter")}
