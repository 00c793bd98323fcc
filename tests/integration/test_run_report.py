"""Issue 13.3/13.4: the run report of real runs -- what its plots draw, what its page says,
and how headless Chromium renders it -- and several runs side by side.

Three runs of tests/scripts/report_fit.py (plain Keras) are shared by every test: one worker,
two workers (another model size, so its plots differ), and a two-worker run that crashes on
every attempt after its first epoch (--max-restarts 1: one gang restart, then failure).
"""

import json
import shutil
import subprocess

import pytest

from conftest import REPORT_ON, ROOT, Run, assert_nothing_left

from tfrun.launch.results.report import (load_run, plot_metrics, plot_resources, plot_throughput,
                                 plot_timeline, write_comparison)
from tfrun.launch.results.runstats import compare, read_run, table_cells

pytestmark = pytest.mark.tf
SCRIPT = str(ROOT / "tests" / "scripts" / "report_fit.py")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    env = {"TFRUN_METRICS_INTERVAL": "1", **REPORT_ON}
    made = {}
    for name, args in (("one", ["--workers", "1", SCRIPT, "--epochs", "3"]),
                       ("two", ["--workers", "2", SCRIPT, "--epochs", "3", "--units", "32"]),
                       ("failed", ["--workers", "2", "--max-restarts", "1", SCRIPT, "--epochs", "3",
                                   "--crash-after-epoch", "1"])):
        run = Run(root, args, env=env, name=name)
        code = run.run(300)
        assert code == (1 if name == "failed" else 0), run.stdout[-4000:]
        assert f"tfrun: report: {run.run_dir / 'report.html'}" in run.stdout
        assert_nothing_left(run)
        made[name] = run
    return made


def test_every_task_is_on_the_timeline_and_one_loss_curve_per_worker(runs):
    data = load_run(runs["two"].run_dir)
    timeline = plot_timeline(data)
    assert [t.get_text() for t in timeline.axes[0].get_yticklabels()] == ["worker:0", "worker:1"]
    assert len(timeline.axes[0].patches) == 2  # one bar per task, one attempt each
    losses = plot_metrics(data)
    curves = [line for line in losses.axes[0].get_lines() if not line.get_label().startswith("_")]
    assert sorted(c.get_label() for c in curves) == ["worker:0", "worker:1"]
    assert all(list(c.get_xdata()) == [1, 2, 3] for c in curves)
    assert plot_throughput(data) is not None and plot_resources(data) is not None
    page = (runs["two"].run_dir / "report.html").read_text()
    # (the progress chart only when a sample fell inside training: this run is short)
    progress = (runs["two"].run_dir / "report" / "step_rates.png").exists()
    per_step = (runs["two"].run_dir / "report" / "per_step.png").exists()
    # ... and the ledger's bar, the report's first chart (issue 72)
    assert page.count("src='data:image/png;base64,") == 5 + progress + per_step
    assert page.index("Where the time went") < page.index("Task timeline")
    assert (runs["two"].run_dir / "report" / "ledger.png").exists()
    assert "<title>tfrun report: two</title>" in page


def test_the_failed_run_shows_its_restart_and_root_cause_traceback(runs):
    run = runs["failed"]
    data = load_run(run.run_dir)
    axes = plot_timeline(data).axes[0]
    assert [t.get_text() for t in axes.texts] == ["restart"]  # the gang restart, marked
    red = [p for p in axes.patches if p.get_facecolor()[:3] == pytest.approx((0.769, 0.306, 0.322), abs=0.01)]
    assert len(red) >= 2  # attempts that failed
    curves = [l.get_label() for l in plot_metrics(data).axes[0].get_lines()]
    assert "worker:0" in curves and "worker:0 (after restart 1)" in curves
    page = (run.run_dir / "report.html").read_text()
    assert "Root cause: worker:" in page and "Traceback (most recent call last)" in page
    assert "RuntimeError: report_fit crashed on purpose after epoch 1" in page


def test_pngs_are_non_empty_and_differ_between_runs_that_differ(runs):
    for name in ("one", "two", "failed"):
        for png in ("timeline", "metrics", "throughput", "resources"):
            assert (runs[name].run_dir / "report" / f"{png}.png").stat().st_size > 5000, (name, png)
    for png in ("timeline", "metrics", "throughput"):
        assert (runs["one"].run_dir / "report" / f"{png}.png").read_bytes() != \
               (runs["two"].run_dir / "report" / f"{png}.png").read_bytes()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (.ci/run installs it)")
@pytest.mark.parametrize("name", ["two", "failed"])
def test_headless_chromium_renders_the_report(runs, name, tmp_path):
    """The docs' screenshot (docs/images/report-failed-run.png) is taken by the same
    script, of the same kind of run as "failed"."""
    page = (runs[name].run_dir / "report.html").as_uri()
    browser = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1100,2400"]
    shot = _screenshot_script().screenshot(runs[name].run_dir / "report.html",
                                           tmp_path / f"{name}.png")
    dom = subprocess.run([*browser, "--dump-dom", page], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert f"<title>tfrun report: {name}</title>" in dom
    assert 'data-broken-images="0"' in dom  # every embedded image decoded and has a size
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[:2] == (2400, 1100)
    assert pixels[..., :3].std() > 0.05  # not a blank page: text and plots drawn
    # The plots' area (below the header) is not blank either.
    assert pixels[400:1400, :, :3].std() > 0.05


def _screenshot_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "report_screenshot", ROOT / "scripts" / "report_screenshot.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_report_of_two_runs_prints_the_table_and_the_page_has_the_same(runs, tmp_path):
    a, b = str(runs["one"].run_dir), str(runs["two"].run_dir)
    out = subprocess.run(["tfrun", "report", a, b, "--html", str(tmp_path / "cmp.html"),
                          "--json", str(tmp_path / "cmp.json")],
                         capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "speedup" in lines[0] and "efficiency" in lines[0]
    assert lines[1].startswith(a) and lines[2].startswith(b)
    rows = json.loads((tmp_path / "cmp.json").read_text())["runs"]
    assert rows[0]["speedup"] == 1.0 and rows[1]["speedup"] > 0 and rows[1]["workers"] == 2
    page = (tmp_path / "cmp.html").read_text()
    for cells in table_cells(compare([read_run(a), read_run(b)])):
        tag = "th" if cells[0] == "run" else "td"
        assert "".join(f"<{tag}>{c}</{tag}>" for c in cells) in page, cells


def test_report_of_one_run_writes_it_again_and_bad_dirs_are_named(runs, tmp_path):
    report = runs["one"].run_dir / "report.html"
    report.unlink()
    out = subprocess.run(["tfrun", "report", str(runs["one"].run_dir)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and report.exists(), out.stderr
    bad = subprocess.run(["tfrun", "report", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and f"{tmp_path} is not a finished tfrun run" in bad.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written into it


def test_comparison_page_without_a_browser_has_its_charts(runs, tmp_path):
    """The throughput, and the runs' ledgers side by side (issue 72)."""
    page = write_comparison([runs["one"].run_dir, runs["failed"].run_dir], tmp_path / "x.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and "failed" in page
    assert "Where the time went" in page
