"""The viewer notebook in a real headless browser: JupyterLab serves it, Chromium runs it, the widgets render.

JupyterLab ships its widget manager with the server, so nothing is fetched
from the network (an HTML export would load it from a CDN). The screenshot
is kept in ``test-artifacts/`` for CI to collect.
"""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import papermill as pm
import pytest

from digiq.paths import ROOT

ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright = pytest.importorskip("playwright.sync_api", reason="playwright is in the dev extra (make test installs it)")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium (.ci/run installs it)"),
]
TOKEN = "digiq-test"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab(values_root):
    """A JupyterLab server on loopback, rooted at the viewer dataset, with the parametrised notebook in it."""
    pm.execute_notebook(str(ROOT / "notebooks" / "13_explore_values.ipynb"), str(values_root / "viewer.ipynb"),
                        parameters={"root": str(values_root)}, prepare_only=True)  # fmt: skip
    port = _free_port()
    labconfig = values_root / ".jupyter" / "labconfig"
    labconfig.mkdir(parents=True, exist_ok=True)  # no first-run news question over the screenshots
    (labconfig / "page_config.json").write_text(
        '{"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": true}}'
    )
    # Start the notebook's kernel without asking: under load JupyterLab may otherwise put "Select Kernel" over the page.
    settings = values_root / ".jupyter" / "lab" / "user-settings"
    tracker = settings / "@jupyterlab" / "notebook-extension" / "tracker.jupyterlab-settings"
    tracker.parent.mkdir(parents=True, exist_ok=True)
    tracker.write_text('{"autoStartDefaultKernel": true}')
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(values_root / ".jupyter"), "JUPYTERLAB_SETTINGS_DIR": str(settings),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}", "--ServerApp.ip=127.0.0.1",
         f"--IdentityProvider.token={TOKEN}", f"--ServerApp.root_dir={values_root}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={TOKEN}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail(f"JupyterLab did not start on {url}")
            time.sleep(0.5)
    tracker_api = f"{url}/lab/api/settings/@jupyterlab/notebook-extension:tracker?token={TOKEN}"
    assert json.load(urllib.request.urlopen(tracker_api, timeout=10))["settings"]["autoStartDefaultKernel"] is True
    yield url
    server.terminate()
    server.wait(timeout=30)


def test_viewer_notebook_renders_its_widgets_in_chromium(lab):
    ARTIFACTS.mkdir(exist_ok=True)
    errors: list[str] = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.on(
            "console", lambda m: errors.append(m.text) if m.type == "error" and "widget" in m.text.lower() else None
        )
        page.goto(f"{lab}/lab/tree/viewer.ipynb?token={TOKEN}")
        page.wait_for_selector(".jp-Notebook", timeout=60_000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=60_000)
        # Run All; a click before the kernel has connected runs nothing, so try again then.
        for attempt in range(3):
            try:  # both viewers' screenshot images are live widget views
                page.click(".lm-MenuBar-itemLabel:text-is('Run')", timeout=10_000)
                page.click(".lm-Menu-itemLabel:text-is('Run All Cells')", timeout=10_000)
                page.wait_for_function("document.querySelectorAll('.widget-image img, img.widget-image').length >= 2",
                                       timeout=60_000)  # fmt: skip
                break
            except playwright.TimeoutError:
                page.screenshot(path=str(ARTIFACTS / f"viewer_attempt{attempt}.png"))
        else:
            pytest.fail("the viewers never rendered; see test-artifacts/viewer_attempt*.png")
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=120_000)
        dropdowns = page.locator(".widget-dropdown select").count()
        sliders = page.locator(".widget-slider").count()
        exceptions = page.locator("[data-mime-type='application/vnd.jupyter.error']").count()
        tables = page.locator(".widget-html table").count()
        for name in ("No", "Dismiss"):  # JupyterLab's first-run news question, if it is there
            if page.locator(f".jp-toast-button:text-is('{name}')").count():
                page.locator(f".jp-toast-button:text-is('{name}')").first.click()
        viewers = page.locator(".jp-OutputArea-output > .widget-vbox")
        for i, name in enumerate(("trajectory_viewer", "action_viewer")):
            viewers.nth(i).screenshot(path=str(ARTIFACTS / f"{name}.png"))
        browser.close()
    assert dropdowns >= 4 and sliders >= 2 and tables >= 2, (dropdowns, sliders, tables)
    assert exceptions == 0 and not errors, errors
    for name in ("trajectory_viewer", "action_viewer"):
        assert (ARTIFACTS / f"{name}.png").stat().st_size > 10_000
