"""A kernel that runs as a user of its own starts where it can write files.

Its working directory is the one the start asks for (``KERNEL_WORKING_DIR``, else the agent's
root_dir) when its user may create files there; otherwise its replica's private ``work/``
folder, which its kernel.log says once. Kernels that run as the agent's user start where they
are told, as before.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kernelfleet.kernels.agent.kernel_process import KernelUser, choose_isolation
from kernelfleet.privileges import kernel_uid, not_writable_by
from kernelfleet.runtime_file import AgentRuntime, read_runtime
from kernelfleet.testing import Fleet, call_json, kernel_reachable_folder

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux users")
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="files of other users need root")

WRITE_AND_READ = """
import json, os
with open("out.txt", "w") as f:
    f.write("written by " + str(os.getuid()))
with open("out.txt") as f:
    print(json.dumps({"cwd": os.getcwd(), "read": f.read()}))
"""


@pytest.fixture
def folder() -> Iterator[Path]:
    """A fresh folder that other users may traverse (mode 0711), owned by this user."""
    path = kernel_reachable_folder()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def replica_dir(fleet: Fleet, kernel_id: str) -> Path:
    runtime = read_runtime(fleet.state_dir / "host-1", AgentRuntime)
    assert runtime is not None
    status, host = call_json(runtime.address + "/api/host", token=fleet.token)
    assert status == 200, host
    (replica,) = [r for r in host["replicas"] if r["kernel_id"] == kernel_id]
    return fleet.state_dir / "host-1" / "replicas" / replica["id"]


async def run_cell(fleet: Fleet, kernel_id: str) -> dict[str, str]:
    ws = await fleet.connect(kernel_id)
    try:
        reply = await ws.execute(WRITE_AND_READ, timeout=60)
    finally:
        ws.close()
    assert reply.reply["status"] == "ok", reply.reply
    result: dict[str, str] = json.loads(reply.stdout)
    return result


@as_root
@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_kernel_of_its_own_user_writes_files_in_its_working_directory(
    private_fleet: Callable[..., Fleet], folder: Path
) -> None:
    fleet = private_fleet(hosts=1, gpus=0, replicas=1)
    if not choose_isolation(KernelUser.AUTO, fleet.state_dir / "host-1" / "replicas").per_kernel:
        pytest.skip("kernels run as the agent's user here")
    shared = folder / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # every user may create files here, as in /tmp
    read_only = folder / "read-only"
    read_only.mkdir(mode=0o755)

    unwritable = fleet.start_kernel()  # the agent's root_dir: this repository, root's 0755
    asked_unwritable = fleet.start_kernel(env={"KERNEL_WORKING_DIR": str(read_only)})
    writable = fleet.start_kernel(env={"KERNEL_WORKING_DIR": str(shared)})

    for kernel_id, wanted in [(unwritable, Path.cwd()), (asked_unwritable, read_only)]:
        result, directory = await run_cell(fleet, kernel_id), replica_dir(fleet, kernel_id)
        assert result == {
            "cwd": str(directory / "work"),
            "read": f"written by {kernel_uid(kernel_id)}",
        }
        assert (directory / "work" / "out.txt").stat().st_uid == kernel_uid(kernel_id)
        kernel_log = (directory / "kernel.log").read_text()
        said = f"the kernel starts in {directory / 'work'}, not in {wanted}: "
        assert kernel_log.count(said) == 1, kernel_log
        assert not (wanted / "out.txt").exists()

    result = await run_cell(fleet, writable)
    assert result == {"cwd": str(shared), "read": f"written by {kernel_uid(writable)}"}
    assert (shared / "out.txt").stat().st_uid == kernel_uid(writable)
    assert "the kernel starts in" not in (replica_dir(fleet, writable) / "kernel.log").read_text()


INSTALL_AND_IMPORT = """
import os, site, sys
with open(os.path.join(site.getusersitepackages(), "kf_user_module.py"), "w") as f:
    f.write("ANSWER = 42\\n")  # what `pip install --user` does, without an index to reach
import kf_user_module
print(kf_user_module.ANSWER, site.getusersitepackages() in sys.path)
"""


@as_root
@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_a_kernel_of_its_own_user_imports_what_it_installed_for_its_user(
    private_fleet: Callable[..., Fleet],
) -> None:
    """``%pip install`` in a kernel that cannot write the environment installs for its user;
    that folder is on ``sys.path`` from the start, so the running kernel imports it."""
    fleet = private_fleet(hosts=1, gpus=0, replicas=1)
    if not choose_isolation(KernelUser.AUTO, fleet.state_dir / "host-1" / "replicas").per_kernel:
        pytest.skip("kernels run as the agent's user here")
    kernel_id = fleet.start_kernel()
    ws = await fleet.connect(kernel_id)
    try:
        result = await ws.execute(INSTALL_AND_IMPORT, timeout=60)
    finally:
        ws.close()
    assert result.reply["status"] == "ok", result.reply
    assert result.stdout == "42 True\n"


@as_root
def test_not_writable_by_reads_the_mode_bits_of_the_users_class(folder: Path) -> None:
    uid = kernel_uid("cwd-test")
    target = folder / "target"
    target.mkdir(mode=0o755)
    assert not_writable_by(target, uid, uid) == (
        f"{target} is uid 0's, mode 0755 (uid {uid} cannot write in it)"
    )
    target.chmod(0o777)
    assert not_writable_by(target, uid, uid) is None
    os.chown(target, uid, 0)
    target.chmod(0o077)  # the owner's own bits decide, not the others'
    assert "cannot write in it" in (not_writable_by(target, uid, uid) or "")
    target.chmod(0o700)
    assert not_writable_by(target, uid, uid) is None
    os.chown(target, 0, uid)
    target.chmod(0o070)  # its group's bits
    assert not_writable_by(target, uid, uid) is None
    assert not_writable_by(target, uid + 1, uid + 1) is not None
    target.chmod(0o777)
    folder.chmod(0o700)
    assert not_writable_by(target, uid, uid) == (
        f"{folder} is uid 0's, mode 0700 (uid {uid} cannot traverse it)"
    )
    folder.chmod(0o711)
    assert not_writable_by(folder / "missing", uid, uid) is not None
