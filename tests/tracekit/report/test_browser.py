"""The HTML report renders in a real headless browser: no errors, every image loaded, a picture.

Needs chromium (Debian: apt-get install -y chromium); skipped when it is not installed.
"""

import importlib.util
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
from tests.paths import REPO

ROOT = REPO
BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None)

pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium/chrome on PATH")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--virtual-time-budget=5000"]


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    pytest.importorskip("matplotlib")
    from tracekit.report import write_report

    spec = importlib.util.spec_from_file_location("inspect_divergence", os.path.join(ROOT, "samples", "inspect_divergence.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    tmp = tmp_path_factory.mktemp("report")
    write_report(*mod.make_runs(str(tmp)), tmp / "report.html")
    return tmp


def _browser(args, cwd):
    # a private profile: nothing shared with (or left behind for) any other browser on the machine
    profile = os.path.join(cwd, "profile")
    return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_every_image_loads_and_nothing_errs(page):
    out = _browser(["--dump-dom", (page / "report.html").as_uri()], str(page))
    body = re.search(r"<body[^>]*>", out.stdout)
    assert body, out.stderr[-2000:]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))
    # the page's own script counted: 1 loss plot + 5 heatmaps + 1 worst-tensor plot
    assert attrs.get("data-images") == "7", body.group(0)
    assert attrs.get("data-broken-images") == "0"
    assert attrs.get("data-errors") == "0"
    assert 'id="load-warning" class="warn" hidden' in out.stdout


def test_screenshot_shows_the_page(page):
    from PIL import Image

    shot = page / "shot.png"
    _browser([f"--screenshot={shot}", "--window-size=1200,2400", (page / "report.html").as_uri()], str(page))
    assert shot.exists()
    im = np.asarray(Image.open(shot).convert("RGB"))
    assert im.shape[:2] == (2400, 1200)
    # the red FAIL banner is there, and the page is not blank
    red = (im[..., 0] > 180) & (im[..., 1] < 80) & (im[..., 2] < 80)
    assert red.sum() > 5000
    assert len(np.unique(im.reshape(-1, 3), axis=0)) > 200
