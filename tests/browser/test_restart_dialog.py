"""A restart the user asks for, in a real browser: JupyterLab restarts the fleet kernel as it
restarts a local one, without "The kernel appears to have died" (its dialog for a crash)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kernelfleet.testing import Fleet
from tests.browser.test_jupyterlab import CHROMIUM, CHROMIUM_ARGS, OUTPUT_DIR, Lab, lab

__all__ = ["lab"]  # the fixture: JupyterLab in gateway mode on the shared fleet

pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.timeout(240),
    pytest.mark.skipif(
        not Path(CHROMIUM).exists() and os.environ.get("CI") != "true",
        reason="Chromium is not installed (apt-get install chromium); CI=true makes this a failure",
    ),
]
CRASH_DIALOG = "appears to have died"


def test_a_user_restart_shows_no_crash_dialog(fleet: Fleet, lab: Lab) -> None:
    from playwright.sync_api import expect, sync_playwright

    dialogs: list[str] = []

    def answer(dialog) -> None:
        """Every dialog is noted, then answered with its default ("Restart", "Ok"...)."""
        dialogs.append(dialog.first.inner_text())
        dialog.first.locator(".jp-mod-accept").first.click()

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True
        )
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        try:
            page.add_locator_handler(page.locator(".jp-Dialog"), answer)
            page.goto(f"{lab.url}/lab?token={lab.token}", timeout=90_000)
            page.locator('.jp-LauncherCard[data-category="Notebook"]').first.click(timeout=90_000)
            notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")
            idle = page.locator(".jp-StatusBar-TextItem", has_text="| Idle")
            expect(idle.first).to_be_visible(timeout=90_000)

            def run(code: str) -> None:
                editor = notebook.locator(".jp-Cell .jp-InputArea-editor .cm-content").last
                editor.click(timeout=60_000)
                page.keyboard.insert_text(code)
                page.keyboard.press("Shift+Enter")

            run("secret = 'before the restart'; print(secret)")
            output = notebook.locator(".jp-OutputArea-output")
            expect(output.first).to_contain_text("before the restart", timeout=60_000)

            page.get_by_role("menuitem", name="Kernel").click()
            page.locator(".lm-Menu-itemLabel", has_text="Restart Kernel…").first.click()
            # The confirmation is answered (the handler), the kernel restarts, JupyterLab
            # reconnects; a cell run meanwhile waits for the new kernel.
            expect(page.locator(".jp-Dialog")).to_have_count(0, timeout=30_000)
            expect(idle.first).to_be_visible(timeout=90_000)
            run("print('after the restart', 'secret' in globals())")
            expect(output.last).to_contain_text("after the restart False", timeout=60_000)
            page.wait_for_timeout(2000)  # a late dialog would still be noted
        finally:
            OUTPUT_DIR.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(OUTPUT_DIR / "restart-dialog.png"), full_page=True)
            browser.close()
            status, sessions = lab.request("GET", "/api/sessions")
            for session in sessions if status == 200 else []:
                lab.request("DELETE", f"/api/sessions/{session['id']}")

    assert any("Restart" in text for text in dialogs), f"no restart was confirmed: {dialogs}"
    assert not [text for text in dialogs if CRASH_DIALOG in text], dialogs
