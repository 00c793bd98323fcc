"""tfrun.in_task.start.collector: Python's garbage collector held back while TensorFlow imports and
at a task's exit, through the real bootstrap. What it saves: benchmarks/bench_task_start.py."""

import gc
import json
import os
import subprocess
import sys
import textwrap

import pytest

from tfrun.in_task.start import collector

#: A task script that reports what the collector looked like at each point it cares about.
PROBE = """
    import atexit, gc, json, os, sys
    report = {"at_start": gc.get_threshold()[0]}
    if os.environ.get("PROBE_IMPORT"):
        __import__(os.environ["PROBE_IMPORT"])
        report["after_import"] = gc.get_threshold()[0]

    class Finalized:  # garbage in a cycle: only a collection frees it
        def __del__(self):
            open(os.environ["PROBE_MARK"], "w").close()
    cycle = Finalized()
    cycle.me = cycle
    del cycle

    def at_exit():  # runs after the bootstrap's end of the task, like any atexit function
        report["frozen"] = gc.get_freeze_count()
        print("probe " + json.dumps(report), flush=True)
    atexit.register(at_exit)
    if os.environ.get("PROBE_EXIT"):
        sys.exit(int(os.environ["PROBE_EXIT"]))
"""


def _probe(tmp_path, **env) -> tuple[int, dict, str]:
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(PROBE))
    base = {k: v for k, v in os.environ.items() if not k.startswith("TFRUN_")}
    result = subprocess.run([sys.executable, "-m", "tfrun.in_task.start.bootstrap", str(script)],
                            env={**base, "PROBE_MARK": str(tmp_path / "finalized"), **env},
                            capture_output=True, text=True, timeout=120)
    lines = [l for l in result.stdout.splitlines() if l.startswith("probe ")]
    assert lines, result.stdout[-2000:] + result.stderr[-2000:]
    return result.returncode, json.loads(lines[-1][len("probe "):]), result.stderr


def test_a_task_collects_rarely_until_tensorflow_is_imported_then_as_python_does(tmp_path):
    code, report, err = _probe(tmp_path, PROBE_IMPORT="tensorflow")
    assert code == 0, err[-3000:]
    assert report["at_start"] == collector.IMPORT_THRESHOLD
    assert report["after_import"] == gc.get_threshold()[0] == 700  # Python's own default
    assert (tmp_path / "finalized").exists(), "the script's cyclic garbage was never finalized"
    assert report["frozen"] > 10_000, "the task's objects were not frozen before its teardown"


@pytest.mark.parametrize("exit_code", [0, 3])
def test_a_task_ending_by_sys_exit_keeps_its_code_and_still_collects_once(tmp_path, exit_code):
    code, report, err = _probe(tmp_path, PROBE_EXIT=str(exit_code))
    assert code == exit_code, err[-3000:]
    assert (tmp_path / "finalized").exists() and report["frozen"] > 0
    assert report["at_start"] == collector.IMPORT_THRESHOLD  # no TensorFlow: still raised


def test_untouched_leaves_python_s_collector_as_it_is(tmp_path):
    code, report, err = _probe(tmp_path, TFRUN_PYTHON_GC="untouched")
    assert code == 0, err[-3000:]
    assert report == {"at_start": 700, "frozen": 0}


def test_the_threshold_comes_back_after_the_named_import_only(tmp_path, monkeypatch):
    (tmp_path / "heavy_module_for_the_test.py").write_text("VALUE = 1\n")
    (tmp_path / "light_module_for_the_test.py").write_text("VALUE = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = gc.get_threshold()
    try:
        collector.quiet_during_import("heavy_module_for_the_test")
        assert gc.get_threshold() == (collector.IMPORT_THRESHOLD, *saved[1:])
        __import__("light_module_for_the_test")  # another import leaves it raised
        assert gc.get_threshold()[0] == collector.IMPORT_THRESHOLD
        __import__("heavy_module_for_the_test")
        assert gc.get_threshold() == saved
    finally:
        gc.set_threshold(*saved)
        sys.modules.pop("heavy_module_for_the_test", None)
        sys.modules.pop("light_module_for_the_test", None)


def test_thresholds_the_script_set_meanwhile_are_kept(tmp_path, monkeypatch):
    (tmp_path / "another_heavy_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    saved = gc.get_threshold()
    try:
        collector.quiet_during_import("another_heavy_module")
        gc.set_threshold(1234, 5, 6)  # the script's own choice, made before the import
        __import__("another_heavy_module")
        assert gc.get_threshold() == (1234, 5, 6)
    finally:
        gc.set_threshold(*saved)
        sys.modules.pop("another_heavy_module", None)
