"""The fleet token never reaches a notebook: not through its environment, /proc or any file.

A real fleet (gateway and host agents as subprocesses, started with a fresh random token, so no
source file holds it) runs two kernels. A cell of the first reads every ``/proc/*/environ`` and
``/proc/*/cmdline`` it can, and every file it can reach under the fleet's folders, /tmp, its
$HOME, its working directory and the repository (each file's first MiB), and finds no token.
Where the agents run as root, each kernel runs as a user of its own: the cell checks its uid
and its folders, and that it cannot read the other kernel's environment.

The cell never holds the token in a file: it gets it reversed in its code (which IPython's
history stores) and compares inside a function, so nothing reaches the namespace (or Raft).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import kernelfleet
from kernelfleet.kernels.agent.kernel_process import KernelUser, choose_isolation
from kernelfleet.kernels.objectstore import (
    SHARED_ROOT_MODE,
    LocalDirectoryStore,
    ObjectStoreError,
    prepare_shared_root,
)
from kernelfleet.kernels.replica.kernel import drop_secrets
from kernelfleet.privileges import kernel_uid
from kernelfleet.runtime_file import AgentRuntime, read_runtime
from kernelfleet.testing import Fleet, call_json, wait_for

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads Linux's /proc"),
]

REPO_ROOT = Path(kernelfleet.__file__).resolve().parent.parent

SCAN = r"""
def _kernelfleet_scan(reversed_token, roots, known_files, other_pids):
    import json, os
    token = reversed_token[::-1].encode()
    found, read = [], {"environ": 0, "cmdline": 0, "files": 0}

    def check(path, limit=1 << 20):
        try:
            with open(path, "rb") as f:
                data = f.read(limit)
        except OSError:
            return False
        if token in data:
            found.append(path)
        return True

    for pid in os.listdir("/proc"):
        if pid.isdigit():
            for what in ("environ", "cmdline"):
                read[what] += check(f"/proc/{pid}/{what}")
    seen = set()
    for root in roots:
        for folder, dirs, files in os.walk(root, onerror=lambda e: None):
            dirs[:] = [d for d in dirs if d not in ("node_modules",)]
            for name in files:
                path = os.path.join(folder, name)
                if path not in seen and not os.path.islink(path) and os.path.isfile(path):
                    seen.add(path)
                    read["files"] += check(path)
    for path in known_files:
        if path not in seen:
            read["files"] += check(path)
    unreadable = {}
    for pid in other_pids:
        try:
            open(f"/proc/{pid}/environ", "rb").close()
            unreadable[pid] = False
        except OSError:
            unreadable[pid] = True
    print(json.dumps({
        "found": found, "read": read, "uid": os.getuid(), "gid": os.getgid(),
        "groups": os.getgroups(), "home": os.environ.get("HOME"),
        "tmpdir": os.environ.get("TMPDIR"), "ipythondir": os.environ.get("IPYTHONDIR"),
        "has_fleet_token": "KERNELFLEET_TOKEN" in os.environ,
        "other_environ_unreadable": unreadable,
    }))
"""


def agent_replicas(fleet: Fleet, host_id: str) -> list[dict]:
    runtime = read_runtime(fleet.state_dir / host_id, AgentRuntime)
    assert runtime is not None, f"{host_id} has no runtime file"
    status, host = call_json(runtime.address + "/api/host", token=fleet.token)
    assert status == 200, host
    return [
        {**replica, "isolation": host["isolation"], "host": host_id} for replica in host["replicas"]
    ]


def replica_of(fleet: Fleet, kernel_id: str) -> dict:
    for host_id in fleet.hosts:
        for replica in agent_replicas(fleet, host_id):
            if replica["kernel_id"] == kernel_id:
                return replica
    raise AssertionError(f"no agent runs a replica of kernel {kernel_id}")


async def test_no_fleet_token_reaches_a_kernel(private_fleet: Callable[..., Fleet]) -> None:
    token = "isolation-" + secrets.token_hex(16)
    fleet = private_fleet(hosts=2, gpus=1, replicas=1, token=token)
    first, second = fleet.start_kernel(), fleet.start_kernel()
    mine, other = replica_of(fleet, first), replica_of(fleet, second)
    daemons = [fleet.gateway.pid, *(p.pid for p in fleet.hosts.values())]  # type: ignore[union-attr]
    known_files = [str(p) for p in fleet.state_dir.rglob("*") if p.is_file()]
    roots = [str(fleet.state_dir), "/tmp", "~", ".", str(REPO_ROOT)]
    code = (
        SCAN
        + f"_kernelfleet_scan({token[::-1]!r}, [os.path.expanduser(r) for r in {roots!r}], "
        + f"{known_files!r}, {[other['pid'], *daemons]!r})\ndel _kernelfleet_scan"
    )
    ws = await fleet.connect(first)
    try:
        reply = await ws.execute("import os\n" + code, timeout=180)
    finally:
        ws.close()
    assert reply.reply["status"] == "ok", reply.reply
    report = json.loads(reply.stdout)

    assert report["found"] == [], f"the fleet token is readable in {report['found']}"
    written = [
        p for p in fleet.state_dir.rglob("*") if p.is_file() and token in p.read_text("latin-1")
    ]
    assert written == [], "no kernelfleet process writes the token to a file, readable or not"
    assert not report["has_fleet_token"]
    assert report["read"]["cmdline"] > 0, report["read"]
    assert report["read"]["files"] > 0, report["read"]
    for pid in daemons:  # non-dumpable, or another user's: never readable from a kernel
        assert report["other_environ_unreadable"][str(pid)], f"pid {pid}'s environ is readable"

    replica_dir = fleet.state_dir / mine["host"] / "replicas" / mine["id"]
    expected = choose_isolation(KernelUser.AUTO, replica_dir.parent)  # what the agent decided
    assert mine["isolation"] == expected.model()
    if not expected.per_kernel:
        pytest.skip(f"kernels run as the agent's user here: {expected.why}")
    assert report["uid"] == report["gid"] == kernel_uid(first) == mine["uid"]
    assert other["uid"] == kernel_uid(second) != mine["uid"]
    assert report["groups"] in ([], [report["gid"]])
    assert report["other_environ_unreadable"][str(other["pid"])], "another kernel's environ"
    for name in ("home", "tmpdir", "ipythondir"):
        assert report[name].startswith(str(replica_dir / "home")), (name, report[name])
    assert replica_dir.stat().st_uid == os.geteuid()  # the agent's: the kernel cannot swap files
    for folder in ("home", "raft"):
        assert (replica_dir / folder).stat().st_uid == mine["uid"]
        assert (replica_dir / folder).stat().st_mode & 0o777 == 0o700
    assert (replica_dir / "kernel.log").stat().st_mode & 0o777 == 0o600


# ---- the pieces, without a fleet ----------------------------------------------------------------

CHILD = "import sys, time; from kernelfleet.privileges import mark_non_dumpable as m; "


def test_kernel_uids_are_stable_high_and_distinct() -> None:
    uids = {kernel_uid(f"kernel-{i}") for i in range(1000)}
    assert len(uids) == 1000
    assert all(2**24 <= uid < 2**31 for uid in uids)
    assert kernel_uid("kernel-7") == kernel_uid("kernel-7")


@pytest.mark.skipif(os.geteuid() != 0, reason="starts processes as another user")
@pytest.mark.parametrize("non_dumpable", [True, False])
def test_a_non_dumpable_process_hides_its_environment_from_its_own_user(
    non_dumpable: bool,
) -> None:
    uid = kernel_uid("dumpable-test")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SECRET_FOR_TEST": "s3cr3t"}
    code = CHILD + f"ok = m() if {non_dumpable} else True; print(ok, flush=True); time.sleep(30)"
    holder = subprocess.Popen(
        [sys.executable, "-c", code], user=uid, group=uid, env=env, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == b"True"
        reader = subprocess.run(
            [sys.executable, "-c", f"print(open('/proc/{holder.pid}/environ', 'rb').read())"],
            user=uid, group=uid, capture_output=True, env=env,
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    if non_dumpable:
        assert reader.returncode != 0
        assert b"PermissionError" in reader.stderr
    else:
        assert b"s3cr3t" in reader.stdout


def test_an_unreachable_folder_keeps_kernels_as_the_agents_user(tmp_path: Path) -> None:
    private = tmp_path / "private"
    (private / "replicas").mkdir(parents=True)
    private.chmod(0o700)
    isolation = choose_isolation(KernelUser.AUTO, private / "replicas")
    assert not isolation.per_kernel
    assert isolation.owner("k1") is None
    if os.geteuid() == 0:
        assert f"{private} is mode 0700 (others cannot traverse it)" in isolation.warning
        assert "chmod o+x" in isolation.warning
    else:
        assert "not root" in isolation.warning
    same = choose_isolation(KernelUser.SAME, private / "replicas")
    assert not same.per_kernel
    assert not same.warning


def test_kernel_user_same_runs_kernels_as_the_agents_user(tmp_path: Path) -> None:
    """The README's ``kernelfleet host ... --kernel-user same``: the host model says so."""
    state_dir = tmp_path / "host"
    env = {
        **os.environ,
        "KERNELFLEET_TOKEN": "readme-token-0123456789",
        "PYTHONPATH": str(REPO_ROOT),
    }
    agent = subprocess.Popen(
        [sys.executable, "-m", "kernelfleet", "host", "--state-dir", str(state_dir),
         "--port", "0", "--gpus", "0", "--kernel-user", "same"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        runtime = wait_for(
            lambda: read_runtime(state_dir, AgentRuntime, agent.pid), 30, "the agent to listen"
        )
        status, host = call_json(runtime.address + "/api/host", token=env["KERNELFLEET_TOKEN"])
    finally:
        agent.terminate()
        _, log = agent.communicate(timeout=30)
    assert status == 200
    assert host["isolation"] == {
        "kernel_user": "agent",
        "why": "--kernel-user=same: kernels run as the agent's user",
    }
    warnings = [line for line in log.splitlines() if line.startswith(b"[W")]
    assert not [line for line in warnings if b"kernels run as" in line], log
    assert b"kernel isolation: --kernel-user=same" in log


def test_each_kernel_keeps_its_objects_in_a_private_folder(tmp_path: Path) -> None:
    root = prepare_shared_root(tmp_path / "objects")
    assert root.stat().st_mode & 0o7777 == SHARED_ROOT_MODE
    store = LocalDirectoryStore.for_kernel(root, "k1")
    key = store.put(b"value")
    assert store.root == root / "kernel-k1"
    assert store.root.stat().st_mode & 0o777 == 0o700
    assert LocalDirectoryStore.for_kernel(root, "k1").get(key) == b"value"
    planted = root / "kernel-k2"
    planted.mkdir(mode=0o777)
    planted.chmod(0o777)  # as another kernel's user would leave it, to plant objects
    with pytest.raises(ObjectStoreError, match="not this kernel's own private folder"):
        LocalDirectoryStore.for_kernel(root, "k2")
    odd = LocalDirectoryStore.for_kernel(root, "../escape")
    assert odd.root.parent == root


def test_a_replica_drops_the_fleet_token_from_its_environment() -> None:
    environ = {"KERNELFLEET_TOKEN": "t", "KERNELFLEET_KERNEL_ID": "k1", "PATH": "/bin"}
    assert drop_secrets(environ) == ["KERNELFLEET_TOKEN"]
    assert environ == {"KERNELFLEET_KERNEL_ID": "k1", "PATH": "/bin"}
