"""Take a screenshot of a run's report.html with headless Chromium.

    python3 scripts/report_screenshot.py RUN_DIR OUT.png [--width 1100] [--height 2400]

The pictures in docs/images were taken this way, from a directory of their own:
report-main-job.png of ``tfrun --workers 2 examples/mnist_mlp.py`` (``--width 1500
--height 1450``), report-failed-run.png of ``tfrun --workers 2 --max-restarts 1
train_fails.py --epochs 4 --crash-after-epoch 2`` (``train_fails.py``: a copy of
tests/scripts/report_fit.py; ``--width 1500 --height 1500``).
tests/integration/test_run_report.py takes its screenshots with the same function.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def screenshot(report: Path, out: Path, width: int = 1100, height: int = 2400) -> Path:
    """``report`` (an HTML file) rendered by headless Chromium into the PNG ``out``."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        raise SystemExit("needs Chromium (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="tfrun-chromium-") as profile:
        subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                        "--hide-scrollbars", f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", f"--screenshot={out}",
                        report.resolve().as_uri()],
                       capture_output=True, timeout=120, check=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--width", type=int, default=1100)
    parser.add_argument("--height", type=int, default=2400)
    args = parser.parse_args()
    report = args.run_dir / "report.html"
    if not report.is_file():
        print(f"{args.run_dir} has no report.html (a finished tfrun run has one)",
              file=sys.stderr)
        return 2
    screenshot(report, args.out, args.width, args.height)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
