"""Other projects' kernel suites pass against a kernelfleet kernel as against a plain kernel.

In one run: ipykernel's own ``test_message_spec.py`` and ``test_subshells.py`` (fetched from
the installed version's sdist, see `suites`) and jupyter_kernel_test with our
`IPythonKernelTests`, each run (a) against a plain local ipykernel and (b) against a kernel of
a 3-replica fleet through ``kernelfleet bridge``. A test the plain kernel passes must pass
through the bridge, except those `KNOWN_DIFFERENCES` names (docs/conformance.md says why).

Run it alone: ``python -m pytest -m slow tests/conformance/test_suites.py`` (a few minutes).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
from pathlib import Path

import pytest

from tests.conformance.suites import bridge_kernelspec, ipykernel_tests, run_suite

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

HERE = Path(__file__).parent
SUBSHELLS = "kernel subshells are not advertised: a subshell would exist on one replica only"
KNOWN_DIFFERENCES = {
    "tests.test_subshells::*": SUBSHELLS,
    "tests.test_message_spec::test_subshell": SUBSHELLS,
    "tests.test_message_spec::test_kernel_info_request": SUBSHELLS + " (it asserts they are)",
}
"""Tests (JUnit ids, fnmatch patterns) a kernelfleet kernel may fail where a plain one passes,
each with the reason."""


def known_difference(test_id: str) -> str | None:
    return next((why for p, why in KNOWN_DIFFERENCES.items() if fnmatch.fnmatch(test_id, p)), None)


def regressions(plain: dict[str, str], fleet: dict[str, str]) -> list[str]:
    """Tests the plain kernel passed that the fleet kernel did not (missing counts as failed),
    known differences aside."""
    return sorted(
        test_id
        for test_id, outcome in plain.items()
        if outcome == "passed"
        and fleet.get(test_id, "missing") != "passed"
        and known_difference(test_id) is None
    )


def test_a_kernel_that_fails_a_test_the_plain_kernel_passes_is_caught():
    plain = {"a::x": "passed", "a::y": "passed", "tests.test_subshells::z": "passed"}
    fleet = {"a::x": "passed", "a::y": "failed", "tests.test_subshells::z": "failed"}
    assert regressions(plain, fleet) == ["a::y"]
    assert regressions(plain, {"a::x": "passed"}) == ["a::y"]


def test_other_projects_suites_pass_through_the_bridge_as_on_a_plain_kernel(
    fleet_factory, tmp_path
):
    folder = ipykernel_tests()
    shutil.copy(HERE / "ipython_kernel_tests.py", folder / "ipython_kernel_tests.py")
    files = ["tests/test_message_spec.py", "tests/test_subshells.py", "ipython_kernel_tests.py"]
    fleet = fleet_factory(hosts=3, gpus=0, replicas=3)
    plain_env = {k: v for k, v in os.environ.items() if k != "JUPYTER_PATH"}
    plain = run_suite(folder, files, plain_env, tmp_path / "plain.xml")
    bridged_env = bridge_kernelspec(tmp_path / "bridge", fleet.url, fleet.token)
    bridged = run_suite(folder, files, bridged_env, tmp_path / "fleet.xml")

    assert sum(outcome == "passed" for outcome in plain.values()) > 40, plain
    worse = regressions(plain, bridged)
    report = "\n".join(f"  {t}: plain {plain[t]}, kernelfleet {bridged.get(t)}" for t in worse)
    assert not worse, f"kernelfleet fails what a plain kernel passes:\n{report}"
    assert fleet.api("GET", "/api/kernels") == [], "every bridged kernel was shut down"
