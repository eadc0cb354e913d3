"""kernelfleet's magics: parsing and rendering in an in-process IPython shell, then live.

The live tests run cells through the gateway of a real fleet (4 hosts x 1 virtual GPU, 3 replicas
per kernel, so one host is free to migrate to), and in a plain ipykernel that loads the
extension itself.
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from jupyter_client.manager import KernelManager
from traitlets.config import Config

import kernelfleet
from kernelfleet.errors import InvalidRequest
from kernelfleet.kernels.magics import registry, views
from kernelfleet.kernels.magics.fleet import fleet_parser
from kernelfleet.kernels.magics.gpus import devices_report, parse_count
from kernelfleet.kernels.magics.parsing import parse
from kernelfleet.protocol import gpus_magic
from kernelfleet.testing import free_port, wait_for

REPO_ROOT = Path(kernelfleet.__file__).resolve().parent.parent


def readme_examples(language: str) -> list[str]:
    """The `language` code blocks of the README's section on the magics."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme.split("## In the notebook: %magics", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


# ---- in-process: parsing and rendering ---------------------------------------------------------


@pytest.fixture
def shell() -> InteractiveShell:
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    shell.extension_manager.load_extension("kernelfleet.kernels.magics")
    return shell


@pytest.mark.parametrize(
    ("code", "gpus"),
    [
        ("%%gpus 1\nx = 1", 1),
        ("\n  \n%%gpus 0\nx = 1", 0),
        ("%%gpus   12  ", 12),
        ("%%gpus 2  # two for training\nx = 1", 2),
        ("x = 1\n%%gpus 1", None),
        ("%%gpusx 1", None),
        ("%gpus 1", None),
        ("%%gpus --help", None),
        ("", None),
    ],
)
def test_gpus_magic_reads_a_leading_line(code, gpus):
    assert gpus_magic(code) == gpus


@pytest.mark.parametrize("line", ["%%gpus", "%%gpus -1", "%%gpus one", "%%gpus 1 2", "%%gpus 1.5"])
def test_gpus_magic_refuses_a_bad_count_with_the_usage(line):
    with pytest.raises(InvalidRequest, match=r"usage: %%gpus N"):
        gpus_magic(line + "\nx = 1")


def test_fleet_arguments_parse_and_bad_ones_raise_usage_error(capsys):
    parser = fleet_parser()
    assert parse(parser, "").command is None
    assert parse(parser, "events -n 5").n == 5
    assert parse(parser, "events").n == 20
    assert parse(parser, "migrate --host 'host-4'").host == "host-4"
    assert parse(parser, "migrate").host is None
    assert parse(parser, "hosts  # every host").command == "hosts"
    for bad in ["bogus", "events -n 0", "events -n x", "events -n 1001", "migrate host-4", "'"]:
        with pytest.raises(UsageError, match=r"usage: %fleet"):
            parse(parser, bad)
    assert parse(parser, "migrate --help") is None
    assert "usage: %fleet migrate [-h] [--host ID]" in capsys.readouterr().out


def test_the_readme_examples_are_accepted_as_written():
    lines, cell = readme_examples("ipython")
    parser = fleet_parser()
    for line in lines.splitlines():
        magic, _, rest = line.partition(" ")
        if magic == "%fleet":
            assert parse(parser, rest) is not None, line
        else:
            assert magic == "%gpus", line
            assert rest.split("#")[0].strip() == "" or parse_count(rest, "%gpus", "") == 1
    assert gpus_magic(cell) == 1


def test_magics_answer_help_and_refuse_bad_arguments_in_a_shell(shell, capsys):
    for line in ["%fleet --help", "%fleet events -h", "%gpus --help", "%%gpus --help\nboom()"]:
        assert shell.run_cell(line).success, line
    out = capsys.readouterr().out
    assert "usage: %fleet [-h] COMMAND" in out
    assert "usage: %fleet events [-h] [-n N]" in out
    assert out.count("usage: %%gpus N") == 2
    for line in ["%fleet nope", "%gpus -2", "%gpus 1 2", "%%gpus x\nprint('ran')"]:
        result = shell.run_cell(line)
        assert isinstance(result.error_in_exec, UsageError), line
    err = capsys.readouterr().err
    assert "usage: %gpus [N]" in err
    assert "ran" not in capsys.readouterr().out


def test_outside_kernelfleet_fleet_says_so_and_tools_still_list(shell, monkeypatch, capsys):
    for name in list(os.environ):
        if name.startswith("KERNELFLEET_"):
            monkeypatch.delenv(name)
    result = shell.run_cell("%fleet hosts")
    assert type(result.error_in_exec).__name__ == "NotAFleetKernel"
    assert "this kernel is not run by kernelfleet" in str(result.error_in_exec)
    tools = shell.run_cell("%fleet tools").result
    status = {t[1]: t[4] for t in tools.sections[0].rows if t[0] == "magics"}
    assert (status["fleet"], status["gpus"]) == ("loaded", "loaded")
    result = shell.run_cell("%%gpus 1\ny = 40 + 2\ny")
    assert result.success
    assert shell.user_ns["y"] == 42
    assert "asked for 1 GPU, got none: this kernel is not run by kernelfleet" in (
        capsys.readouterr().out
    )


def test_a_failing_gpus_cell_fails_with_the_bodys_error(shell, capsys):
    result = shell.run_cell("%%gpus 0\n1 / 0")
    assert isinstance(result.error_in_exec, ZeroDivisionError)
    assert "ran without GPUs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("asked", "env", "said"),
    [
        (1, {"KERNELFLEET_GPUS": "0", "KERNELFLEET_KERNEL_ID": "k"}, "ran on 1 GPU: 0"),
        (2, {"KERNELFLEET_GPUS": "0,1", "KERNELFLEET_KERNEL_ID": "k"}, "ran on 2 GPUs: 0, 1"),
        (0, {"KERNELFLEET_GPUS": "", "KERNELFLEET_KERNEL_ID": "k"}, "ran without GPUs"),
        (2, {"KERNELFLEET_GPUS": "3", "KERNELFLEET_KERNEL_ID": "k"}, "asked for 2 GPUs, got 1: 3"),
        (1, {"KERNELFLEET_GPUS": "0,1", "KERNELFLEET_KERNEL_ID": "k"}, "(asked for 1)"),
        (1, {}, "asked for 1 GPU, got none: this kernel is not run by kernelfleet"),
    ],
)
def test_a_gpus_cell_reports_the_devices_it_got(asked, env, said):
    assert said in devices_report(asked, env)


KERNEL_MODEL: dict[str, Any] = {
    "id": "k-1",
    "name": "python3",
    "replicas": [
        {"id": "r-a", "host": "host-1", "pid": 11, "state": "ready"},
        {"id": "r-b", "host": "host-2", "pid": 12, "state": "executing"},
        {"id": "r-c", "host": "host-3", "pid": 13, "state": "dead"},
    ],
    "executor": "r-b",
    "gpus": 1,
    "gpus_held": [{"host": "host-2", "devices": ["1"]}],
    "queued_cells": 0,
    "last_activity": 1000.0,
    "notebook_path": "work/<train>.ipynb",
    "user": "ada",
    "recent_cells": [
        {
            "id": "cell-0001-long-id",
            "host": "host-2",
            "gpus": 1,
            "devices": ["1"],
            "queued_at": 990.0,
            "started_at": 1003.1,
            "start_delay_s": 13.1,
            "waited": "waited 13.1 s for 1 GPU (3 cells ahead)",
            "moved_to": "host-2",
            "outcome": None,
            "duration_s": None,
        }
    ],
}


def test_the_kernel_view_shows_replicas_gpus_and_why_cells_waited():
    view = views.kernel_view(KERNEL_MODEL, now=1042.0)
    text, page = repr(view), view._repr_html_()
    for shown in [
        "r-a", "host-1", "executing", "executor", "dead", "1 GPU per cell",
        "holding 1 on host-2 (1)", "waited 13.1 s for 1 GPU (3 cells ahead)",
        "moved to host-2", "13.1 s", "running", "last activity 42.0 s ago", "ada",
    ]:  # fmt: skip
        assert shown in text, shown
        assert views._e(shown) in page, shown
    assert "work/<train>.ipynb" in text
    assert "work/&lt;train&gt;.ipynb" in page
    assert "<train>" not in page
    assert page.count("<table>") == 2
    executor_row = next(line for line in text.splitlines() if line.startswith("r-b"))
    assert executor_row.split() == ["r-b", "host-2", "executing", "executor", "1"]


def test_views_of_an_older_gateways_models_leave_out_what_it_does_not_send():
    old = {key: KERNEL_MODEL[key] for key in ("id", "name", "replicas", "executor")}
    view = views.kernel_view(old)
    assert len(view.sections) == 1
    assert "GPU" not in view.sections[0].note
    assert "r-c" in repr(view)
    hosts = [{"id": "host-1", "state": "alive", "gpus": {"total": 2, "committed": 1}}]
    assert repr(views.hosts_view(hosts)).splitlines()[2].split() == [
        "host-1", "alive", "1", "-", "2", "-",
    ]  # fmt: skip
    fleet = {"version": "0.1", "policy": "packing", "replicas": 3, "autoscaling": None}
    assert "packing" in repr(views.policy_view(fleet))
    event = {"seq": 7, "time": 0.0, "type": "cell-started", "host_id": "host-2",
             "data": {"waited": "waited 2.0 s for 1 GPU (0 cells ahead)"}}  # fmt: skip
    assert "waited 2.0 s for 1 GPU" in repr(views.events_view([event]))
    assert "(none)" in repr(views.events_view([]))


def test_fleet_hosts_shows_relative_speeds_once_a_gpu_is_not_at_one():
    def host(host_id, *speeds):
        devices = [{"id": str(i), "lent_to_job": None, "relative_speed": s}
                   for i, s in enumerate(speeds)]  # fmt: skip
        return {"id": host_id, "state": "alive", "gpus": {"total": len(speeds), "devices": devices}}

    even = repr(views.hosts_view([host("host-1", 1.0, 1.0)]))
    assert "speed" not in even, "no column while every GPU runs at its type's speed"
    lines = repr(views.hosts_view([host("host-1", 0.5, 0.6), host("host-2", 0.5, 1.2)]))
    rows = lines.splitlines()
    assert rows[1].endswith("relative speeds")
    assert rows[2].endswith("0.5, 0.6")
    assert rows[3].endswith("0.5, 1.2")


# ---- the registry ------------------------------------------------------------------------------

FAKE_TOOL = """
from IPython.core.magic import register_line_magic

loads = []

def load(ipython):
    loads.append(ipython)
    ipython.register_magic_function(lambda line: "hello " + line, "line", "hello")

def explode(ipython):
    raise RuntimeError("this tool is broken")
"""


@pytest.fixture
def fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A distribution ``fake-tool`` on sys.path with three magics (one works, one cannot be
    imported, one raises) and a panel section."""
    (tmp_path / "fake_tool_magics.py").write_text(FAKE_TOOL)
    info = tmp_path / "fake_tool-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-tool\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[kernelfleet.magics]\n"
        "hello = fake_tool_magics:load\n"
        "missing = fake_tool_no_such_module:load\n"
        "explodes = fake_tool_magics:explode\n"
        "[kernelfleet.panel_sections]\n"
        "hello = fake_tool_panel:section\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("fake_tool_magics", None)


def test_each_tool_loads_once_and_a_broken_one_does_not_stop_the_others(fake_tool, capsys):
    config = Config()
    config.HistoryManager.enabled = False
    shell = InteractiveShell(config=config)
    shell.run_line_magic("load_ext", "kernelfleet.kernels.magics")
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2, err
    assert "the magic 'explodes' (fake_tool_magics:explode) did not load: RuntimeError" in err[0]
    assert "the magic 'missing' (fake_tool_no_such_module:load) did not load: " in err[1]
    assert shell.run_line_magic("hello", "world") == "hello world"
    assert shell.run_line_magic("fleet", "--help") is None, "kernelfleet's own loaded too"
    registry.load_all(shell)
    import fake_tool_magics  # type: ignore[import-not-found]

    assert fake_tool_magics.loads == [shell], "loaded once"
    assert capsys.readouterr().err == "", "a failure is reported once"
    rows = {
        (row[0], row[1]): row for row in shell.run_line_magic("fleet", "tools").sections[0].rows
    }
    assert rows[("magics", "hello")][2:] == ("fake-tool 1.0", "fake_tool_magics:load", "loaded")
    assert rows[("magics", "explodes")][4].startswith("failed: RuntimeError: this tool is broken")
    assert rows[("panel_sections", "hello")][2:] == (
        "fake-tool 1.0",
        "fake_tool_panel:section",
        "-",
    )


def test_pyproject_declares_kernelfleets_own_magics():
    declared = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert declared["entry-points"][registry.MAGICS_GROUP] == registry.OWN


# ---- live: a plain ipykernel -------------------------------------------------------------------


def run_in(km: KernelManager, code: str) -> dict[str, Any]:
    """Run `code`; its reply's content plus ``stdout`` and ``outputs`` (display data)."""
    client = km.client()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        stdout: list[str] = []
        outputs: list[dict[str, Any]] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream" and msg["content"]["name"] == "stdout":
                stdout.append(msg["content"]["text"])
            elif msg["msg_type"] in ("execute_result", "display_data"):
                outputs.append(msg["content"]["data"])

        reply = client.execute_interactive(code, timeout=60, output_hook=hook)["content"]
        return {**reply, "stdout": "".join(stdout), "outputs": outputs}
    finally:
        client.stop_channels()


@pytest.fixture
def plain_kernel() -> Any:
    """A plain ipykernel, not run by kernelfleet, started with `env` on first call."""
    managers: list[KernelManager] = []

    def start(env: dict[str, str]) -> KernelManager:
        km = KernelManager(kernel_name="python3")
        base = {k: v for k, v in os.environ.items() if not k.startswith("KERNELFLEET_")}
        km.start_kernel(env={**base, **env})
        managers.append(km)
        return km

    yield start
    for km in managers:
        km.shutdown_kernel(now=True)


@pytest.mark.slow
def test_a_plain_ipykernel_loads_the_magics_and_they_say_it_is_not_kernelfleet(plain_kernel):
    km = plain_kernel({})
    assert run_in(km, "%load_ext kernelfleet.kernels.magics")["status"] == "ok"
    reply = run_in(km, "%fleet")
    assert reply["ename"] == "NotAFleetKernel"
    assert "this kernel is not run by kernelfleet" in reply["evalue"]
    reply = run_in(km, "%%gpus 1\nprint('body ran')")
    assert reply["status"] == "ok"
    assert (
        "body ran\nasked for 1 GPU, got none: this kernel is not run by kernelfleet"
        in (reply["stdout"])
    )


@pytest.mark.slow
def test_an_unreachable_gateway_is_a_clear_error_naming_its_url(plain_kernel):
    url = f"http://127.0.0.1:{free_port()}"
    env = {
        "KERNELFLEET_GATEWAY_URL": url,
        "KERNELFLEET_KERNEL_TOKEN": "kfk1.k-1.x",
        "KERNELFLEET_KERNEL_ID": "k-1",
    }
    km = plain_kernel(env)
    run_in(km, "%load_ext kernelfleet.kernels.magics")
    for line in ["%fleet", "%fleet hosts", "%gpus 1"]:
        reply = run_in(km, line)
        assert reply["ename"] == "GatewayUnreachable", line
        assert f"the kernelfleet gateway at {url} is unreachable" in reply["evalue"]
        assert reply["traceback"] == [f"GatewayUnreachable: {reply['evalue']}"], "one line"


# ---- live: kernels of a real fleet -------------------------------------------------------------


@pytest.fixture(scope="module")
def magic_fleet(fleet_factory):
    return fleet_factory(hosts=4, gpus=1, replicas=3)


@pytest.fixture
def kernel(magic_fleet):
    """``await kernel(env)``: a kernel of `magic_fleet` started with `env` (none: no
    KERNEL_GPUS) and a websocket client of it; both closed when the test ends."""
    kernels = []

    async def start(env: dict[str, str] | None = None):
        kernel_id = magic_fleet.start_kernel(env=env)
        client = await magic_fleet.connect(kernel_id)
        kernels.append((kernel_id, client))
        return kernel_id, client

    yield start
    for kernel_id, client in kernels:
        client.close()
        magic_fleet.api("DELETE", f"/api/kernels/{kernel_id}", expect=204)


def result_data(reply: Any) -> dict[str, Any]:
    results = reply.of_type("execute_result")
    assert results, f"no result: {reply.reply}"
    return results[-1]["content"]["data"]


@pytest.mark.slow
async def test_every_replica_kernel_loads_the_magics_and_they_refuse_bad_arguments(kernel):
    _, client = await kernel()
    tools = await client.execute("%fleet tools")
    assert re.search(r"fleet .* loaded", result_data(tools)["text/plain"])
    assert re.search(r"gpus .* loaded", result_data(tools)["text/plain"])
    help_ = await client.execute("%fleet --help")
    assert help_.reply["status"] == "ok"
    assert "usage: %fleet [-h] COMMAND" in help_.stdout
    for line in ["%fleet bogus", "%fleet events -n none", "%%gpus -1\nprint('ran')"]:
        bad = await client.execute(line)
        assert bad.reply["ename"] == "UsageError", line
        assert "usage: %" in bad.reply["evalue"]
        assert "ran" not in bad.stdout


@pytest.mark.slow
async def test_a_gpus_cell_says_which_device_it_ran_on(kernel):
    _, client = await kernel({"KERNEL_GPUS": "1"})
    cell = await client.execute(readme_examples("ipython")[1])  # as the README says
    assert cell.reply["status"] == "ok", cell.reply
    assert cell.stdout == "bound 0\nran on 1 GPU: 0\n"


@pytest.mark.slow
async def test_fleet_shows_this_kernels_replicas_and_hosts(kernel, magic_fleet):
    kernel_id, client = await kernel()
    await client.execute("x = 1")
    model = magic_fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    shown = result_data(await client.execute("%fleet"))
    assert f"kernel {kernel_id}" in shown["text/plain"]
    for replica in model["replicas"]:
        for data in (shown["text/plain"], shown["text/html"]):
            assert replica["id"] in data
            assert replica["host"] in data
    assert "executor" in shown["text/plain"]
    hosts = result_data(await client.execute("%fleet hosts"))
    for host in ("host-1", "host-2", "host-3", "host-4"):
        assert host in hosts["text/plain"]
        assert host in hosts["text/html"]
    policy = result_data(await client.execute("%fleet policy"))
    assert "notebookos" in policy["text/plain"]


@pytest.mark.slow
async def test_fleet_events_lists_this_kernels_cells(kernel):
    _, client = await kernel()
    await client.execute("x = 1")
    shown = result_data(await client.execute("%fleet events -n 50"))["text/plain"]
    assert "cell-started" in shown
    assert "cell-finished" in shown


@pytest.mark.slow
async def test_fleet_migrate_moves_the_kernel_and_refuses_an_unknown_host(kernel, magic_fleet):
    kernel_id, client = await kernel()
    await client.execute("x = 41")
    before = magic_fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    taken = {replica["host"] for replica in before["replicas"]}
    free = next(h for h in ("host-1", "host-2", "host-3", "host-4") if h not in taken)
    moved = await client.execute(f"%fleet migrate --host {free}", timeout=60)
    assert moved.reply["status"] == "ok", moved.reply
    assert f"to {free} once this cell ends" in moved.stdout
    wait_for(
        lambda: (
            free
            in {
                r["host"]
                for r in magic_fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
            }
        ),
        60,
        f"the kernel's replica to move to {free} after the cell",
    )
    assert (await client.execute("print(x + 1)")).stdout == "42\n"
    unknown = await client.execute("%fleet migrate --host host-99")
    assert unknown.reply["ename"] == "FleetApiError"
    assert "host-99" in unknown.reply["evalue"]
    assert "404" in unknown.reply["evalue"]
    now = magic_fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
    executor_host = next(r["host"] for r in now["replicas"] if r["id"] == now["executor"])
    holding = sorted({r["host"] for r in now["replicas"]} - {executor_host})[0]
    busy = await client.execute(f"%fleet migrate --host {holding}")
    assert busy.reply["ename"] == "FleetApiError"
    assert "409" in busy.reply["evalue"]


@pytest.mark.slow
async def test_gpus_sets_the_kernels_default_and_a_plain_cell_then_holds_a_gpu(kernel):
    _, client = await kernel()
    plain = "import os; print('bound', repr(os.environ['KERNELFLEET_GPUS']))"
    assert (await client.execute(plain)).stdout == "bound ''\n"
    assert "1 GPU each from now on" in (await client.execute("%gpus 1")).stdout
    assert "this kernel's cells get 1 GPU each" in (await client.execute("%gpus")).stdout
    assert (await client.execute(plain)).stdout == "bound '0'\n"
    too_many = await client.execute("%gpus 5")
    assert too_many.reply["ename"] == "FleetApiError"
    assert "400" in too_many.reply["evalue"]
    await client.execute("%gpus 0")
    assert (await client.execute(plain)).stdout == "bound ''\n"


@pytest.mark.slow
async def test_a_gpus_cell_gets_its_gpus_from_the_gateway(kernel):
    _, client = await kernel()
    cell = await client.execute("%%gpus 1\nprint('in the cell')")
    assert cell.stdout == "in the cell\nran on 1 GPU: 0\n"


def test_cells_of_one_client_get_distinct_short_ids():
    """jupyter_client names cells ``<session>_<pid>_<n>``: their first 8 characters are all
    the same, so %fleet showed every cell under one id."""
    from kernelfleet.kernels.magics.views import cells_section

    ids = [
        "9b922568-4c1e09e2f3a1b4c5d6e7f809_1608_236",
        "9b922568-4c1e09e2f3a1b4c5d6e7f809_1608_237",
    ]
    rows = cells_section([{"id": cell_id} for cell_id in ids]).rows
    assert [row[0] for row in rows] == ["1608_236", "1608_237"]
