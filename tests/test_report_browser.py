"""``report.html`` opens in a real browser and shows its plots (issue 3).

Uses headless Chromium (Debian's ``chromium`` package: ``apt-get install -y chromium``). The test loads a
copy of a freshly made demo report with a small script added that records, once the page has loaded, how
many of its images decoded (``img.complete && img.naturalWidth > 0``), reads that back with
``--dump-dom``, and takes a screenshot that must show more than a blank page. Skipped, with the reason,
only where no Chromium executable can be found. The report is the one of the demo that
tests/test_cli.py runs (a few thousand flights, a one-second budget per method).
"""

import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from tests.test_cli import run_demo

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars"]

CHECK = """
<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  document.body.setAttribute("data-images-total", String(imgs.length));
  document.body.setAttribute("data-images-loaded", String(ok.length));
  document.body.setAttribute("data-image-sizes",
    imgs.map(function (i) { return i.naturalWidth + "x" + i.naturalHeight; }).join(","));
});
</script>
"""


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A copy of the report of the demo run by tests/test_cli.py (run here if that module did not run)."""
    proc, out, _ = run_demo(tmp_path_factory)
    assert proc.returncode == 0, proc.stderr[-2000:]
    copy = tmp_path_factory.mktemp("browser") / "report"
    shutil.copytree(out, copy)
    return copy


def _browser(args, profile, timeout=90):
    exe = _chromium()
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.skipif(_chromium() is None, reason="Chromium not found: install Debian's chromium package "
                                                "(apt-get install -y chromium) to run the browser test")
def test_report_shows_its_plots_in_chromium(report, tmp_path):
    html = (report / "report.html").read_text()
    expected = re.findall(r'<img src="([^"]+)"', html)
    assert len(expected) == 4
    check = report / "browser-check.html"
    check.write_text(html.replace("</body>", CHECK + "</body>"))
    try:
        proc = _browser(["--virtual-time-budget=10000", "--dump-dom", check.as_uri()], tmp_path / "profile1")
    finally:
        check.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    total = re.search(r'data-images-total="(\d+)"', proc.stdout)
    loaded = re.search(r'data-images-loaded="(\d+)"', proc.stdout)
    assert total and loaded, "the check script did not run: " + proc.stdout[:500]
    assert int(total.group(1)) == len(expected)
    assert int(loaded.group(1)) == len(expected), re.search(r'data-image-sizes="([^"]*)"', proc.stdout).group(1)
    sizes = re.search(r'data-image-sizes="([^"]*)"', proc.stdout).group(1).split(",")
    assert all(int(s.split("x")[0]) > 300 and int(s.split("x")[1]) > 200 for s in sizes), sizes

    shot = tmp_path / "report.png"
    proc = _browser(["--window-size=1200,2400", f"--screenshot={shot}", (report / "report.html").as_uri()],
                    tmp_path / "profile2")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(str(shot))
    assert img.shape[0] >= 2000 and img.shape[1] >= 1000
    rgb = img[..., :3]
    # plots, not a blank or text-only page: many pixels far from white, and many distinct colours
    assert np.mean(np.min(rgb, axis=-1) < 0.8) > 0.02
    assert len(np.unique((rgb[::4, ::4] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 200
    assert not os.path.exists(report / "browser-check.html")
