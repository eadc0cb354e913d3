"""The kernelfleet JupyterLab panel in a real browser, against a live fleet.

JupyterLab (a ``jupyter lab --gateway-url=...`` subprocess) loads this package's prebuilt
extension (extension/labextension, linked into the server's private data dir as an installed
wheel puts it into share/jupyter/labextensions). The first test's fleet has three hosts of one
GPU each and kernels of three replicas (``private_fleet``). The live GPU test runs against
``kernelfleet up --hosts 1 --gpus-per-host 1 --replicas 1``, as a user starts it, and asks for
the GPU as a user would, with ``%%gpus 1`` (JupyterLab sends no cell metadata with an
execute_request).

Headless Chromium (Playwright, Debian's ``/usr/bin/chromium``) opens a notebook, opens the panel
from the status bar, and checks the kernel's replicas, the fleet's hosts and "no GPU"; a cell that
sleeps shows "GPU x1 · host-1" while it runs and "no GPU" after; a second notebook holding the only
GPU makes a cell wait, panel and status bar say so, and once it ran the panel's recent cells say
how long it waited. A gateway killed under an open panel is shown as "gateway unreachable", and
the panel recovers by itself when a gateway answers again. A job submitted with ``%schedule``
shows in the Jobs section, its GPU marked lent, and a cell that needs that GPU preempts it.
Screenshots, light and dark, land in ``test-output/browser/``.
"""

from __future__ import annotations

import os
import re
import secrets
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import kernelfleet.extension
from kernelfleet.testing import Fleet, Up, free_port, wait_for
from tests.browser.test_jupyterlab import CHROMIUM, CHROMIUM_ARGS, OUTPUT_DIR, Lab, write_json

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
        reason="Chromium is not installed (apt-get install chromium); CI=true makes this a failure",
    ),
]
LABEXTENSION = Path(kernelfleet.extension.__file__).resolve().parent / "labextension"
GPU_ON_HOST_1 = "GPU \N{MULTIPLICATION SIGN}1 · host-1"
WAITED = re.compile(r"^waited \d+\.\d s for 1 GPU · ran on host-1$")
THEME_SETTINGS = ("@jupyterlab", "apputils-extension", "themes.jupyterlab-settings")


@pytest.fixture
def start_lab(tmp_path: Path) -> Iterator[Callable[..., Lab]]:
    """``start_lab(fleet, **env)``: JupyterLab with the kernelfleet extension, in gateway mode
    on `fleet`, with `env` added to its environment."""
    labs: list[Lab] = []

    def start(fleet: Fleet | Up, **extra_env: str) -> Lab:
        assert (LABEXTENSION / "package.json").is_file(), (
            "the labextension is not built: pip install -e . (or jlpm build in extension/)"
        )
        config_dir, data_dir, root_dir = (tmp_path / d for d in ("config", "data", "notebooks"))
        root_dir.mkdir()
        (data_dir / "labextensions").mkdir(parents=True)
        (data_dir / "labextensions" / "kernelfleet").symlink_to(LABEXTENSION)
        write_json(
            config_dir / "jupyter_server_config.json",
            {"ServerApp": {"jpserver_extensions": {"kernelfleet.extension": True}}},
        )
        settings = config_dir / "lab" / "user-settings"
        write_json(
            settings / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings",
            {"fetchNews": "false", "checkForUpdates": False},
        )
        write_json(settings.joinpath(*THEME_SETTINGS), {"theme": "JupyterLab Light"})
        env = {
            **os.environ,
            "JUPYTER_CONFIG_DIR": str(config_dir),
            "JUPYTER_DATA_DIR": str(data_dir),
            "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "JUPYTER_PLATFORM_DIRS": "1",
            "PYTHONUNBUFFERED": "1",
            **extra_env,
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
        labs.append(lab)
        wait_for(lab.ready, 90, "jupyter lab to answer /api/status", interval=0.25)
        return lab

    yield start
    for lab in labs:
        status, sessions = lab.request("GET", "/api/sessions")
        for session in sessions if status == 200 else []:
            lab.request("DELETE", f"/api/sessions/{session['id']}")
        lab.process.terminate()
        try:
            lab.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(lab.process.pid, 9)
            lab.process.wait()
        OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
        (OUTPUT_DIR / "fleet-panel-jupyterlab.log").write_text(lab.log())


def settings_file(lab: Lab) -> Path:
    return Path(lab.log_path).parent / "config" / "lab" / "user-settings"


class Browser:
    """One JupyterLab page, with the steps a user takes."""

    def __init__(self, page: Any, lab: Lab) -> None:
        from playwright.sync_api import expect

        self.page, self.lab, self.expect = page, lab, expect
        self.status = page.locator(".jp-KernelfleetStatus")
        self.panel = page.locator("#kernelfleet-panel")

    def open(self) -> None:
        self.page.goto(f"{self.lab.url}/lab?token={self.lab.token}", timeout=90_000)

    def new_notebook(self, new_launcher: bool = False) -> Any:
        """A new Python notebook from the launcher (a new one: `new_launcher`), once its
        kernel is idle."""
        before = len(self.sessions())
        if new_launcher:
            self.page.locator(".lm-DockPanel-tabBar .lm-TabBar-addButton").first.click()
        card = self.page.locator('.jp-LauncherCard[data-category="Notebook"]:visible').first
        card.click(timeout=90_000)
        # Its own session first: the status bar's "Idle" may still be another notebook's, and
        # JupyterLab drops a cell run before the notebook's session has a kernel.
        wait_for(lambda: len(self.sessions()) > before, 90, "the new notebook's session")
        notebook = self.page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
        idle = self.page.locator(".jp-StatusBar-TextItem", has_text="| Idle")
        self.expect(idle.first).to_be_visible(timeout=90_000)
        return notebook

    def sessions(self) -> list[Any]:
        status, sessions = self.lab.request("GET", "/api/sessions")
        return sessions if status == 200 and isinstance(sessions, list) else []

    def run(self, notebook: Any, code: str) -> None:
        editor = notebook.locator(".jp-Cell .jp-InputArea-editor .cm-content").last
        editor.click(timeout=60_000)
        self.page.keyboard.insert_text(code)
        self.expect(editor).to_have_text(code, use_inner_text=True)
        self.page.keyboard.press("Shift+Enter")

    def theme(self, name: str) -> None:
        """Switch the theme from the Settings menu, as a user does (no reload)."""
        self.page.get_by_role("menuitem", name="Settings").click()
        for label in ("Theme", name):
            item = self.page.locator(".lm-Menu-itemLabel", has_text=re.compile(f"^{label}$"))
            item.click()
        light = name == "JupyterLab Light"
        self.expect(self.page.locator("body")).to_have_attribute(
            "data-jp-theme-light", "true" if light else "false"
        )
        # The attribute changes before the theme's CSS has loaded (JupyterLab shows its splash
        # screen meanwhile; the panel is transparent in between): wait for the panel's own
        # opaque background, bright or dark.
        self.page.wait_for_function(
            """light => ['#kernelfleet-panel', '.jp-DirListing-content'].every(selector => {
                const element = document.querySelector(selector);
                if (!element) return true;
                const rgb = getComputedStyle(element).backgroundColor.match(/[0-9.]+/g);
                if (!rgb || rgb.length !== 3) return false;  // rgba(): not loaded yet
                const sum = rgb.reduce((a, c) => a + Number(c), 0);
                return light ? sum > 600 : sum < 200;
            })""",
            arg=light,
            timeout=30_000,
        )
        self.expect(self.page.locator("#jupyterlab-splash")).to_have_count(0, timeout=30_000)
        # and let two frames paint the new colours before any screenshot
        self.page.evaluate(
            "() => new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))"
        )

    def shot(self, name: str) -> None:
        OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
        self.page.screenshot(path=str(OUTPUT_DIR / f"fleet-panel-{name}.png"))


def browse(lab: Lab, steps: Callable[[Browser], None]) -> None:
    from playwright.sync_api import sync_playwright

    console: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 860})
            page.on("console", lambda m: console.append(f"[{m.type}] {m.text}"))
            page.on("pageerror", lambda e: console.append(f"[pageerror] {e}"))
            page.add_locator_handler(
                page.locator(".jp-Dialog"),
                lambda dialog: dialog.locator(".jp-mod-accept").first.click(),
            )
            user = Browser(page, lab)
            try:
                user.open()
                steps(user)
            finally:
                user.shot("last")
                OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
                (OUTPUT_DIR / "fleet-panel-console.log").write_text("\n".join(console) + "\n")
        finally:
            browser.close()


def assert_inside_the_panel(user: Browser, rows: Any) -> None:
    """Nothing in `rows` reaches past the panel's right edge (where the sidebar clips it)."""
    right = user.panel.evaluate("e => e.getBoundingClientRect().right")
    for cell in rows.locator("td").all():
        assert cell.evaluate("e => e.getBoundingClientRect().right") <= right, (
            f"{cell.inner_text()!r} is clipped at the panel's right edge"
        )


def kernel_of(lab: Lab) -> str:
    status, sessions = lab.request("GET", "/api/sessions")
    assert status == 200, sessions
    return str(sessions[-1]["kernel"]["id"])


def test_panel_shows_the_notebooks_kernel_and_the_fleet(
    private_fleet: Callable[..., Fleet], start_lab: Callable[..., Lab]
) -> None:
    fleet = private_fleet(hosts=3, gpus=1, replicas=3)
    lab = start_lab(fleet)

    def steps(user: Browser) -> None:
        expect = user.expect
        notebook = user.new_notebook()
        expect(user.status).to_have_text("no GPU", timeout=30_000)
        user.status.click()  # the status item opens the panel
        expect(user.panel).to_be_visible()
        kernel_id = kernel_of(lab)
        model = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")
        replicas = user.panel.locator(".jp-KernelfleetPanel-replicas tbody tr")
        expect(replicas).to_have_count(3, timeout=30_000)
        for replica in model["replicas"]:
            row = replicas.filter(has_text=replica["id"].rsplit("-", 1)[-1])
            expect(row).to_contain_text(replica["host"])
        user.run(notebook, "print('on the fleet')")
        expect(notebook.locator(".jp-OutputArea-output").last).to_contain_text("on the fleet")
        executor = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["executor"]
        executor_row = replicas.filter(has_text="executor")
        expect(executor_row).to_contain_text(executor.rsplit("-", 1)[-1], timeout=15_000)
        hosts = user.panel.locator(".jp-KernelfleetPanel-hosts tbody tr")
        expect(hosts).to_have_count(3)
        for host in fleet.api("GET", "/api/fleet/hosts"):
            gpus = host["gpus"]
            expect(hosts.filter(has_text=host["id"])).to_contain_text(
                f"{gpus['committed']} / {gpus['subscribed']} / {gpus['total']}"
            )
        expect(user.panel).to_contain_text(kernel_id[:8])
        user.shot("light")

        write_json(settings_file(lab).joinpath(*THEME_SETTINGS), {"theme": "JupyterLab Dark"})
        user.page.reload()
        expect(user.status).to_have_text("no GPU", timeout=90_000)
        user.status.click()
        expect(replicas).to_have_count(3, timeout=30_000)
        background = user.panel.evaluate("e => getComputedStyle(e).backgroundColor")
        assert background != "rgb(255, 255, 255)", "the dark theme left the panel white"
        user.shot("dark")

    browse(lab, steps)


def test_panel_and_status_bar_follow_the_gpus_live(
    kernelfleet_up: Callable[..., Up], start_lab: Callable[..., Lab]
) -> None:
    """Against ``kernelfleet up`` with one host of one GPU; cells ask for it with ``%%gpus 1``,
    as a user would, and a second notebook's cell keeps it busy so that one waits."""
    up = kernelfleet_up("--hosts", "1", "--gpus-per-host", "1", "--replicas", "1")
    lab = start_lab(up)

    def steps(user: Browser) -> None:
        expect = user.expect
        first = user.new_notebook()
        expect(user.status).to_have_text("no GPU", timeout=30_000)
        expect(user.panel).to_be_hidden()
        user.status.click()  # the status-bar item opens the panel
        expect(user.panel).to_be_visible()
        gpus_now = user.panel.locator(".jp-KernelfleetPanel-gpus")
        expect(gpus_now).to_have_text("none", timeout=30_000)

        user.run(first, "%fleet")
        kernel_id = kernel_of(lab)
        shown = first.locator(".jp-OutputArea-output").last
        expect(shown).to_contain_text(kernel_id[:8], timeout=30_000)
        expect(shown).to_contain_text("host-1")
        (replica,) = up.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
        replicas = user.panel.locator(".jp-KernelfleetPanel-replicas tbody tr")
        expect(replicas).to_have_count(1)
        expect(replicas).to_contain_text(replica["id"].rsplit("-", 1)[-1])
        expect(replicas).to_contain_text("host-1")
        expect(replicas).to_contain_text("executor", timeout=15_000)

        user.run(first, "%%gpus 1\nimport time; time.sleep(6); print('slept')")
        expect(user.status).to_have_text(GPU_ON_HOST_1, timeout=15_000)
        expect(gpus_now).to_have_text("1 GPU on host-1 (device 0)")
        expect(replicas.locator(".jp-KernelfleetPanel-state")).to_have_text("executing")
        assert_inside_the_panel(user, replicas)
        user.shot("gpu-bound")
        expect(first.locator(".jp-OutputArea-output").last).to_contain_text(
            "ran on 1 GPU", timeout=30_000
        )
        expect(user.status).to_have_text("no GPU", timeout=10_000)
        expect(gpus_now).to_have_text("none")

        second = user.new_notebook(new_launcher=True)  # holds the only GPU for a while
        user.run(second, "%%gpus 1\nimport time; time.sleep(25); print('released')")
        expect(user.status).to_have_text(GPU_ON_HOST_1, timeout=15_000)
        user.page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab").first.click()
        user.run(first, "%%gpus 1\nprint('got the GPU')")
        expect(user.status).to_have_text("waiting for GPU", timeout=15_000)
        expect(user.panel.locator(".jp-KernelfleetPanel-waiting")).to_contain_text(
            "waiting for 1 GPU"
        )
        user.shot("waiting")
        user.theme("JupyterLab Dark")
        expect(user.status).to_have_text("waiting for GPU")
        user.shot("waiting-dark")
        user.theme("JupyterLab Light")

        # The second notebook's cell ends, the GPU is released and the waiting cell runs.
        expect(first.locator(".jp-OutputArea-output").last).to_contain_text(
            "got the GPU", timeout=60_000
        )
        expect(user.status).to_have_text("no GPU", timeout=10_000)
        expect(user.panel.locator(".jp-KernelfleetPanel-waiting")).to_have_count(0)
        newest = user.panel.locator(".jp-KernelfleetPanel-cells li").first
        expect(newest).to_have_text(WAITED, timeout=10_000)
        user.shot("waited")

    browse(lab, steps)


def test_panel_says_the_gateway_is_unreachable_and_recovers_by_itself(
    private_fleet: Callable[..., Fleet], start_lab: Callable[..., Lab]
) -> None:
    """The gateway dies while the panel is open: the panel and the status bar say "gateway
    unreachable"; a gateway started again on the same port is picked up without a click."""
    fleet = private_fleet(hosts=1, gpus=1, replicas=1)
    lab = start_lab(fleet)

    def steps(user: Browser) -> None:
        expect = user.expect
        user.new_notebook()
        user.status.click()
        hosts = user.panel.locator(".jp-KernelfleetPanel-hosts tbody tr")
        expect(hosts).to_have_count(1, timeout=30_000)

        assert fleet.gateway is not None
        port = int(fleet.url.rsplit(":", 1)[1])
        os.killpg(fleet.gateway.pid, signal.SIGKILL)
        fleet.gateway.wait(20)
        expect(user.panel).to_contain_text("gateway unreachable", timeout=20_000)
        expect(user.status).to_have_text("gateway unreachable")
        user.shot("unreachable")

        fleet.start_gateway(*fleet.gateway_args, port=port)
        expect(user.panel).not_to_contain_text("gateway unreachable", timeout=40_000)
        expect(hosts).to_have_count(1, timeout=30_000)
        expect(hosts).to_contain_text("host-1")

    browse(lab, steps)


def test_panel_says_the_kernel_is_degraded_and_why(
    private_fleet: Callable[..., Fleet], start_lab: Callable[..., Lab]
) -> None:
    """A host goes with one of the kernel's 3 replicas, and no other host can take a new one:
    the panel says the kernel runs degraded, on how many replicas, and why; a cell still runs."""
    fleet = private_fleet(hosts=3, gpus=0, replicas=3)
    lab = start_lab(fleet)

    def steps(user: Browser) -> None:
        expect = user.expect
        notebook = user.new_notebook()
        user.status.click()
        replicas = user.panel.locator(".jp-KernelfleetPanel-replicas tbody tr")
        expect(replicas).to_have_count(3, timeout=30_000)
        kernel_id = kernel_of(lab)
        executor = fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["executor"]
        lost = next(
            r for r in fleet.api("GET", f"/api/fleet/kernels/{kernel_id}")["replicas"]
            if r["id"] != executor
        )  # fmt: skip
        fleet.hosts[lost["host"]].kill()  # its agent, at once: the gateway hears its link close
        degraded = user.panel.locator(".jp-KernelfleetPanel-degraded")
        expect(degraded).to_contain_text("degraded: 2 of 3 replicas", timeout=30_000)
        expect(degraded).to_contain_text(lost["host"])
        expect(degraded).to_contain_text("a replacement waits")
        user.run(notebook, "print('still running')")
        expect(notebook.locator(".jp-OutputArea-output").last).to_contain_text("still running")
        user.shot("degraded")

    browse(lab, steps)


JOB_SCRIPT = """\
import time
from kernelfleet.jobs.sdk import current_job

job = current_job()
step = job.load_checkpoint() or 0
while step < job.steps:
    time.sleep(0.05)
    step += 1
    job.report(step, throughput=20.0)
    if job.should_stop:
        job.save_checkpoint(step)
        break
"""


def test_panel_shows_a_running_job_and_the_gpus_lent_to_it(
    private_fleet: Callable[..., Fleet], start_lab: Callable[..., Lab]
) -> None:
    """A notebook submits a job with ``%schedule``: the panel's Jobs section shows it running
    with its progress and lease, the host's device grid marks its GPU as lent, and the status
    bar counts the kernel's job; a ``%%gpus 2`` cell preempts it, the panel counts the
    preemption, and the job runs again once the cell is done."""
    # Rounds of 3 s: the job is placed again soon after the cell releases its GPU.
    fleet = private_fleet(hosts=1, gpus=2, replicas=1, gateway_args=("--GatewayApp.job_round_s=3",))
    lab = start_lab(fleet)

    def steps(user: Browser) -> None:
        expect = user.expect
        notebook = user.new_notebook()
        user.status.click()
        expect(user.panel).to_be_visible()
        user.run(notebook, f"open('train.py', 'w').write({JOB_SCRIPT!r});")
        user.run(notebook, "%schedule submit train.py --gpus 1 --steps 3000 --name resnet")
        output = notebook.locator(".jp-OutputArea-output").last
        expect(output).to_contain_text("submitted job-", timeout=30_000)
        (job,) = fleet.api("GET", "/api/fleet/jobs")["jobs"]
        item = user.panel.locator(".jp-KernelfleetPanel-job", has_text=job["id"])
        expect(item.locator(".jp-KernelfleetPanel-state")).to_have_text("running", timeout=30_000)
        expect(item).to_contain_text("resnet")
        expect(item).to_contain_text("this kernel")
        expect(item).to_contain_text(re.compile(r"[1-9]\d* / 3000 steps"), timeout=15_000)
        lease = fleet.api("GET", f"/api/fleet/jobs/{job['id']}")["lease"]
        expect(item).to_contain_text(f"1 GPU · {lease['host']} [{lease['devices'][0]}]")
        lent = user.panel.locator(
            ".jp-KernelfleetPanel-hosts .jp-KernelfleetPanel-device.jp-mod-job"
        )
        expect(lent).to_have_count(1, timeout=15_000)
        assert lent.get_attribute("title") == f"device {lease['devices'][0]}: lent to {job['id']}"
        expect(user.panel.locator(".jp-KernelfleetPanel-jobsline")).to_contain_text(
            "1 running · 1 GPU lent"
        )
        expect(user.status).to_have_text("no GPU · 1 job")
        assert_inside_the_panel(user, user.panel.locator(".jp-KernelfleetPanel-hosts tbody tr"))
        user.run(notebook, "%schedule")
        table = notebook.locator(".jp-OutputArea-output").last
        expect(table.locator("tr", has_text=job["id"])).to_contain_text("running")
        user.shot("jobs")

        # A cell that needs both GPUs takes the lent one back: the job stops, and resumes later.
        before = fleet.api("GET", f"/api/fleet/jobs/{job['id']}")["steps_done"]
        user.run(notebook, "%%gpus 2\nimport time; time.sleep(4); print('cell done')")
        expect(item).to_contain_text("1 preemption", timeout=30_000)
        expect(notebook.locator(".jp-OutputArea-output").last).to_contain_text(
            "cell done", timeout=30_000
        )
        expect(item.locator(".jp-KernelfleetPanel-state")).to_have_text("running", timeout=60_000)
        resumed_from = fleet.api("GET", f"/api/fleet/jobs/{job['id']}")["steps_done"]
        assert resumed_from >= before, "it resumed from its checkpoint, not from step 0"
        user.shot("jobs-resumed")
        fleet.api("DELETE", f"/api/fleet/jobs/{job['id']}")
        expect(item.locator(".jp-KernelfleetPanel-state")).to_have_text(
            re.compile("stopping|cancelled"), timeout=30_000
        )

    browse(lab, steps)
