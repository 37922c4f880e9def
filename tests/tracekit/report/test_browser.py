"""The HTML report renders in a real headless browser: no errors, every image loaded, a picture.

Needs chromium (Debian: apt-get install -y chromium); skipped when it is not installed.
"""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

BROWSER = next((b for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None)

pytestmark = pytest.mark.skipif(BROWSER is None, reason="no chromium/chrome on PATH")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         "--hide-scrollbars", "--virtual-time-budget=5000"]


@pytest.fixture(scope="module")
def page(divergence_report):
    """The folder of the report of samples/inspect_divergence.py's runs (tests/tracekit/report/conftest.py)."""
    return divergence_report.path.parent


def _browser(args, cwd):
    # a private profile: nothing shared with (or left behind for) any other browser on the machine
    profile = os.path.join(cwd, "profile")
    return subprocess.run([BROWSER, *FLAGS, f"--user-data-dir={profile}", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def browsed(page):
    """One browser run for both tests: its DOM after the page's scripts ran (stdout), and a
    screenshot (chromium writes both in one headless run)."""
    shot = page / "shot.png"
    out = _browser(["--dump-dom", f"--screenshot={shot}", "--window-size=1200,2400", (page / "report.html").as_uri()],
                   str(page))
    return out, shot


def test_every_image_loads_and_nothing_errs(browsed):
    out, _ = browsed
    body = re.search(r"<body[^>]*>", out.stdout)
    assert body, out.stderr[-2000:]
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))
    # the page's own script counted: 1 loss plot + 5 heatmaps + 1 worst-tensor plot
    assert attrs.get("data-images") == "7", body.group(0)
    assert attrs.get("data-broken-images") == "0"
    assert attrs.get("data-errors") == "0"
    assert 'id="load-warning" class="warn" hidden' in out.stdout


def test_screenshot_shows_the_page(browsed):
    from PIL import Image

    out, shot = browsed
    assert shot.exists(), out.stderr[-2000:]
    im = np.asarray(Image.open(shot).convert("RGB"))
    assert im.shape[:2] == (2400, 1200)
    # the red FAIL banner is there, and the page is not blank
    red = (im[..., 0] > 180) & (im[..., 1] < 80) & (im[..., 2] < 80)
    assert red.sum() > 5000
    rgb = (im[..., 0].astype(np.uint32) << 16) | (im[..., 1].astype(np.uint32) << 8) | im[..., 2]  # a colour, one number
    assert len(np.unique(rgb)) > 200
