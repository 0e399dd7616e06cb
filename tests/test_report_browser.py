"""``report.html`` opens in a real browser, shows its plots at their natural size and reads cleanly
(issues 3 and 9).

Uses headless Chromium (Debian's ``chromium`` package: ``apt-get install -y chromium``; .ci/run installs it).
For each report (the demo's, and a single-method ``tallmh run`` report) the test loads a copy with a small
script added that records, once the page has loaded and laid out at 1,280 px width: how many images
decoded (``img.complete && img.naturalWidth > 0``), each image's natural width against the width of the
column it sits in, and the page's visible text; it reads that back with ``--dump-dom``. Then it takes a
screenshot at 1,280 px width that must show more than a blank page. Skipped, with the reason, only where no
Chromium executable can be found.
"""

import html as html_mod
import json
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from tests.test_cli import run_demo

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage", "--hide-scrollbars", "--disable-extensions", "--mute-audio"]
WIDTH = 1280

CHECK = """
<script>
window.addEventListener("load", function () {
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; });
  var fit = imgs.map(function (i) {
    var col = i.parentElement.getBoundingClientRect().width;
    return {src: i.getAttribute("src"), natural: i.naturalWidth, shown: i.getBoundingClientRect().width,
            column: col};
  });
  var out = document.createElement("pre");
  out.id = "browser-check";
  out.textContent = JSON.stringify({total: imgs.length, loaded: ok.length, fit: fit,
                                    text: document.body.innerText, width: window.innerWidth});
  document.body.appendChild(out);
});
</script>
"""

ENTITY = re.compile(r"&(#\d+|#x[0-9a-fA-F]+|[a-zA-Z]+);")


def _chromium():
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


needs_chromium = pytest.mark.skipif(_chromium() is None, reason="Chromium not found: install Debian's chromium "
                                    "package (apt-get install -y chromium) to run the browser test")


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    """A copy of the report of the demo run by tests/test_cli.py (run here if that module did not run)."""
    proc, out, _ = run_demo(tmp_path_factory)
    assert proc.returncode == 0, proc.stderr[-2000:]
    copy = tmp_path_factory.mktemp("browser") / "report"
    shutil.copytree(out, copy)
    return copy


@pytest.fixture(scope="module")
def run_report(tmp_path_factory):
    """A single-method report of ``tallmh run`` on a small table with awkward column names."""
    import pandas as pd

    from tallmh.cli import main

    root = tmp_path_factory.mktemp("runreport")
    rng = np.random.default_rng(0)
    df = pd.DataFrame({"dose <mg>": rng.normal(5, 2, 600), "age & sex": rng.normal(0, 1, 600),
                       "x \"quoted\"": rng.normal(0, 1, 600)})
    df["y"] = (rng.random(600) < 1 / (1 + np.exp(-0.3 * df["dose <mg>"] + 1.5))).astype(int)
    df.to_csv(root / "t.csv", index=False)
    rc = main(["run", str(root / "t.csv"), "--target", "y", "--samples", "200", "--warmup", "100", "--quiet",
               "--out", str(root / "out")])
    assert rc == 0
    return root / "out"


def _browser(args, profile, timeout=120):
    exe = _chromium()
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=timeout)


def _check(report, tmp_path, n_images):
    html = (report / "report.html").read_text()
    expected = re.findall(r'<img src="([^"]+)"', html)
    assert len(expected) == n_images
    check = report / "browser-check.html"
    check.write_text(html.replace("</body>", CHECK + "</body>"))
    try:
        proc = _browser([f"--window-size={WIDTH},2000", "--virtual-time-budget=10000", "--dump-dom", check.as_uri()],
                        tmp_path / "profile1")
    finally:
        check.unlink()
    assert proc.returncode == 0, proc.stderr[-2000:]
    m = re.search(r'<pre id="browser-check">(.*?)</pre>', proc.stdout, re.S)
    assert m, "the check script did not run: " + proc.stdout[:500]
    info = json.loads(html_mod.unescape(m.group(1)))
    assert info["total"] == len(expected)
    assert info["loaded"] == len(expected), info["fit"]
    for f in info["fit"]:
        # every plot fits its column at its natural size: nothing squeezed (tick labels stay readable)
        assert 300 < f["natural"] <= f["column"] + 0.5, f
        assert abs(f["shown"] - f["natural"]) <= 2, f
    text = info["text"]
    # no escaped entities in what the reader sees (a double-escaped caption would show "&quot;")
    assert not ENTITY.search(text), ENTITY.search(text).group(0) + " in: " + text[
        max(0, ENTITY.search(text).start() - 80): ENTITY.search(text).end() + 80]
    assert not os.path.exists(report / "browser-check.html")
    return text


def _screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    proc = _browser([f"--window-size={WIDTH},2400", f"--screenshot={shot}", (report / "report.html").as_uri()],
                    tmp_path / "profile2")
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    import matplotlib.image as mpimg

    img = mpimg.imread(str(shot))
    assert img.shape[1] == WIDTH and img.shape[0] >= 2000
    rgb = img[..., :3]
    # plots, not a blank or text-only page: many pixels far from white, and many distinct colours
    assert np.mean(np.min(rgb, axis=-1) < 0.8) > 0.02
    assert len(np.unique((rgb[::4, ::4] * 255).astype(np.uint8).reshape(-1, 3), axis=0)) > 200


@pytest.mark.slow  # needs the demo (tests/test_cli.py)
@needs_chromium
def test_demo_report_in_chromium(demo_report, tmp_path):
    text = _check(demo_report, tmp_path, 4)
    # the verdict of each method comes first, before the results
    assert text.index("Verdict") < text.index("Results")
    res = json.loads((demo_report / "results.json").read_text())
    for row in res["methods"]:
        assert f"{row['method']}: {row['verdict_line']}" in text
    assert "Lesson: " + res["lesson"] in text  # the lesson, computed from the run, at the top
    _screenshot(demo_report, tmp_path)


@pytest.mark.slow
@needs_chromium
def test_run_report_in_chromium(run_report, tmp_path):
    text = _check(run_report, tmp_path, 3)
    assert text.index("Verdict") < text.index("Results")
    for name in ("dose <mg>", "age & sex", 'x "quoted"'):  # column names shown as written, escaped once
        assert name in text
    # every plot on the original scale, as the table
    assert "Each coefficient (on the original scale of the data" in text and "original scale)" in text
    assert "Each sampled parameter (standardised scale)" not in text
    _screenshot(run_report, tmp_path)
