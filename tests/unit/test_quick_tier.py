"""The quick tier the README shows (``python3 -m pytest -m quick``) selects what it says:
every unit and supervisor test, and the one real 2-worker run marked ``quick``."""

import re
import subprocess
import sys

from conftest import ROOT

TEST_ID = re.compile(r"tests/\S+\.py::\w+(\[.*\])?")
QUICK = [sys.executable, "-m", "pytest", "-m", "quick", "--collect-only", "-q",
         "-p", "no:cacheprovider"]


def test_the_quick_tier_is_every_unit_and_supervisor_test_and_one_real_run():
    assert "\npython3 -m pytest -m quick\n" in (ROOT / "README.md").read_text()
    done = subprocess.run(QUICK, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # Test ids only: a collection warning's line also names a test file and "::".
    ids = [line for line in done.stdout.splitlines() if TEST_ID.fullmatch(line)]
    files = {i.split("::")[0] for i in ids}
    for folder in ("unit", "supervisor"):
        for path in (ROOT / "tests" / folder).glob("test_*.py"):
            assert f"tests/{folder}/{path.name}" in files, path
    elsewhere = [i for i in ids if not i.startswith(("tests/unit/", "tests/supervisor/"))]
    assert elsewhere == ["tests/integration/test_saving_and_resume.py::"
                         "test_worker_crash_restart_resumes_exactly_and_saves_once[keras3]"]
