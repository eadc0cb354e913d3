"""Stock JupyterLab in a real browser, running its notebook kernel on the fleet.

A real ``jupyter lab --gateway-url=...`` subprocess points at the shared fleet; headless Chromium
(Playwright, the system's ``/usr/bin/chromium``) creates a Python notebook, runs a cell and waits
for its output; the gateway's admin API must then show that kernel with a replica on a fleet host.
A screenshot lands in ``test-output/browser/`` under the repository root, pass or fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kernelfleet.testing import Fleet, call_json, free_port, wait_for

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.timeout(240),
    # CI installs Chromium and must run this test; elsewhere a missing browser is a skip.
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
        reason="Chromium is not installed (apt-get install chromium); CI=true makes this a failure",
    ),
]

CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
OUTPUT_DIR = Path(__file__).resolve().parents[2] / "test-output" / "browser"
SCREENSHOT = OUTPUT_DIR / "jupyterlab-notebook.png"
CONSOLE_LOG = SCREENSHOT.parent / "jupyterlab-console.log"
CODE = "print(sum(range(10**6)), 'from kernelfleet')"
EXPECTED = "499999500000 from kernelfleet"


@dataclass
class Lab:
    """A ``jupyter lab`` subprocess in gateway mode."""

    process: subprocess.Popen
    url: str
    token: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def request(self, method: str, path: str) -> tuple[int, Any]:
        try:
            return call_json(self.url + path, method, self.token, timeout=30)
        except OSError:
            return 0, None

    def ready(self) -> bool:
        if self.process.poll() is not None:
            pytest.fail(f"jupyter lab exited with {self.process.returncode}:\n{self.log()[-4000:]}")
        return self.request("GET", "/api/status")[0] == 200


def write_json(path: Path, content: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))


@pytest.fixture
def lab(fleet: Fleet, tmp_path: Path) -> Iterator[Lab]:
    """JupyterLab on a free port, with its own config, data and runtime dirs under `tmp_path`.

    The system-wide ``jupyter_server_config.d`` still applies; the kernelfleet extension is
    enabled in the private config as ``pip install kernelfleet`` would. Lab's news and update
    checks are off.
    """
    config_dir, root_dir = tmp_path / "jupyter-config", tmp_path / "notebooks"
    root_dir.mkdir()
    write_json(
        config_dir / "jupyter_server_config.json",
        {"ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}}},
    )
    write_json(
        config_dir / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        / "notification.jupyterlab-settings",
        {"fetchNews": "false", "checkForUpdates": False},
    )  # fmt: skip
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(config_dir),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter-data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter-runtime"),
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONUNBUFFERED": "1",
    }
    port, token = free_port(), secrets.token_hex(16)
    log_path = tmp_path / "jupyterlab.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
                "--ip=127.0.0.1", f"--port={port}", "--ServerApp.port_retries=0",
                f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root_dir}",
                f"--gateway-url={fleet.url}", f"--GatewayClient.auth_token={fleet.token}",
            ],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
            start_new_session=True,
        )  # fmt: skip
    lab = Lab(process, f"http://127.0.0.1:{port}", token, log_path)
    try:
        wait_for(lab.ready, 90, "jupyter lab to answer /api/status", interval=0.25)
        yield lab
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
        if SCREENSHOT.parent.is_dir():
            shutil.copy(log_path, SCREENSHOT.parent / "jupyterlab.log")


def fleet_kernel_ids(fleet: Fleet) -> set[str]:
    return {k["id"] for k in fleet.api("GET", "/api/fleet/kernels")}


def test_jupyterlab_notebook_runs_on_the_fleet(fleet: Fleet, lab: Lab) -> None:
    from playwright.sync_api import expect, sync_playwright

    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    SCREENSHOT.unlink(missing_ok=True)
    before = fleet_kernel_ids(fleet)
    console: list[str] = []
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
            )
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
                page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
                # Any modal dialog (kernel selection, "build recommended", ...) takes its default.
                page.add_locator_handler(
                    page.locator(".jp-Dialog"),
                    lambda dialog: dialog.locator(".jp-mod-accept").first.click(),
                )
                try:
                    page.goto(f"{lab.url}/lab?token={lab.token}", timeout=90_000)
                    card = page.locator('.jp-LauncherCard[data-category="Notebook"]').first
                    card.click(timeout=90_000)

                    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
                    editor = notebook.locator(".jp-Cell .jp-InputArea-editor .cm-content").first
                    # As a user waits for "Idle": JupyterLab drops a cell run before its session
                    # has a kernel (it clears the cell instead of queueing it).
                    idle = page.locator(".jp-StatusBar-TextItem", has_text="| Idle")
                    expect(idle.first).to_be_visible(timeout=90_000)
                    editor.click(timeout=60_000)
                    # insert_text: no per-key events, so the editor does not auto-close brackets.
                    page.keyboard.insert_text(CODE)
                    expect(editor).to_have_text(CODE)
                    page.keyboard.press("Shift+Enter")

                    output = notebook.locator(".jp-OutputArea-output").first
                    expect(output).to_contain_text(EXPECTED, timeout=90_000)
                    expect(notebook.locator(".jp-InputPrompt").first).to_contain_text("[1]:")
                finally:
                    page.screenshot(path=str(SCREENSHOT), full_page=True)
                    CONSOLE_LOG.write_text("\n".join(console) + "\n")
            finally:
                browser.close()

        status, sessions = lab.request("GET", "/api/sessions")
        assert status == 200, sessions
        (session,) = [s for s in sessions if s["path"].endswith(".ipynb")]
        kernel_id = session["kernel"]["id"]
        assert kernel_id not in before

        fleet_view = {k["id"]: k for k in fleet.api("GET", "/api/fleet/kernels")}
        assert kernel_id in fleet_view, f"lab's kernel {kernel_id} is not a fleet kernel"
        replicas = fleet_view[kernel_id]["replicas"]
        assert replicas, fleet_view[kernel_id]
        assert {r["host"] for r in replicas} <= set(fleet.hosts)
        assert any(r["state"] == "ready" and r["pid"] > 0 for r in replicas), replicas
    finally:
        status, sessions = lab.request("GET", "/api/sessions")
        for session in sessions if status == 200 else []:
            lab.request("DELETE", f"/api/sessions/{session['id']}")
        leftover = fleet_kernel_ids(fleet) - before
        for stray in leftover:
            fleet.request("DELETE", f"/api/kernels/{stray}")
        wait_for(lambda: not fleet_kernel_ids(fleet) - before, 30, "the notebook's kernel to go")
