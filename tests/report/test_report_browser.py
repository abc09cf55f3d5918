"""The report in a real headless Chromium: no console errors, every chart drawn, user text inert.

Needs Debian's `chromium` (installed by .ci/run); skipped with the reason when it is absent.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from raybench.report import write
from tests.report.test_report import FRAME

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=5000"]


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}", *args],
                          capture_output=True, text=True, timeout=120)


def test_report_renders_in_chromium(tmp_path):
    evil = "<script>document.title='PWNED'</script>"
    run = tmp_path / "run"
    run.mkdir()
    FRAME.assign(sweep=evil).to_parquet(run / "results.parquet")
    page = write([run], run / "report.html")
    url = page.as_uri()

    dom = run_chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    console_errors = [line for line in dom.stderr.splitlines()
                      if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)]
    assert console_errors == []
    charts = re.findall(r"<div id=\"(fig-[^\"]+)\"", dom.stdout)
    assert len(charts) >= 3
    for chart in charts:  # plotly replaced each empty div with its drawn SVG
        block = dom.stdout.split(f'id="{chart}"', 1)[1][:5000]
        assert "main-svg" in block, chart
    title = re.search(r"<title>(.*?)</title>", dom.stdout).group(1)
    assert title != "PWNED" and title.startswith("raybench: &lt;script&gt;")  # shown, not run
    assert "&lt;script&gt;document.title='PWNED'&lt;/script&gt;" in dom.stdout

    shot = tmp_path / "report.png"
    done = run_chromium(tmp_path, "--window-size=1400,2400", f"--screenshot={shot}", url)
    assert done.returncode == 0 and shot.stat().st_size > 50_000


def test_compare_page_renders_in_chromium(tmp_path):
    from raybench.report import comparison, judge

    results = [{"trial_key": "a", "config": "batch_size=8", "base": 100.0, "new": 80.0,
                **judge.decide([100.0, 101.0, 99.0, 100.5, 99.5], [80.0, 81.0, 79.0, 80.5])},
               {"trial_key": "b", "config": "batch_size=16", "base": 50.0, "new": 50.2,
                **judge.decide([50.0, 50.1, 49.9, 50.0], [50.2, 50.1, 50.3, 50.2])}]
    page = tmp_path / "compare.html"
    page.write_text(comparison.page(results, "raybench comparison", ["a against b"]))
    dom = run_chromium(tmp_path, "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert [line for line in dom.stderr.splitlines()
            if "CONSOLE" in line and ("Uncaught" in line or "Error" in line)] == []
    block = dom.stdout.split('id="fig-0-ratios"', 1)[1][:5000]
    assert "main-svg" in block and "slower" in dom.stdout
