"""Every failure attributed (issue 44.4): one fault at a time, injected into worker:1 of a
real 2-worker MultiWorkerMirroredStrategy run by the script's own code
(tests/scripts/fault.py). For each: the first failure (its task, host and class) is named in
the console and in summary.json's ``verdict`` before the other task is stopped, worker:0 is
labelled collateral, and no process, port or cgroup is left.

The matrix's other rows run where their setting is: a slow task (a straggler) in
tests/integration/test_hangs.py, a host's link cut on fake hosts in
tests/multihost/test_multihost.py (``test_ssh_a_host_whose_link_is_cut_...``).
"""

import subprocess
from pathlib import Path

import pytest

from conftest import REPORT_ON, Run, assert_nothing_left

pytestmark = pytest.mark.tf

SCRIPT = "tests/scripts/fault.py"
FLAGS = ["--workers", "2", "--stop-grace", "3", "--join-timeout", "40", "--step-timeout", "10"]


def _memory_cgroup(tmp_path: Path, limit: int) -> Path:
    """A memory cgroup with ``limit`` bytes, next to this process's (v1's memory hierarchy
    here; v2 where its memory controller is on), for the run to start in."""
    from tfrun.launch.processes.cgroups import own_cgroup_dir
    v2 = own_cgroup_dir()
    control = None if v2 is None else v2 / "cgroup.subtree_control"
    if control is not None and control.exists() and "memory" in control.read_text().split():
        path, limit_file = v2 / f"tfrun-test-{tmp_path.name}", "memory.max"
    else:
        v1 = own_cgroup_dir("memory")
        assert v1 is not None, "no memory cgroup to limit the run with"
        path, limit_file = v1 / f"tfrun-test-{tmp_path.name}", "memory.limit_in_bytes"
    path.mkdir()
    (path / limit_file).write_text(str(limit))
    return path


def _run_fault(tmp_path: Path, fault: str, *extra: str, wrap: list[str] | None = None,
               flags: tuple[str, ...] = ()) -> Run:
    # (one row's report is enough: the page, not the fault, is under test there)
    run = Run(tmp_path, [*FLAGS, *flags, SCRIPT, fault, "worker:1", "5", *extra],
              env=REPORT_ON if fault == "sigsegv" else None)
    if wrap:
        run.cmd = [*wrap, *run.cmd]
    run.run(timeout=300)
    return run


def _oom(tmp_path: Path) -> Run:
    # Two TensorFlow workers take about 1.4 GB together; worker:1 then allocates until the
    # kernel kills the biggest process of the cgroup: it.
    cgroup = _memory_cgroup(tmp_path, 2500 << 20)
    try:
        return _run_fault(tmp_path, "oom", flags=FLAGS_OF["oom"], wrap=[
            "sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(cgroup)])
    finally:
        cgroup.rmdir()


def _disk_full(tmp_path: Path) -> Run:
    full = tmp_path / "small-disk"
    full.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(full)], check=True)
    try:
        return _run_fault(tmp_path, "disk-full", str(full))
    finally:
        subprocess.run(["umount", str(full)], check=True)


#: fault -> (how it is run, the class, what the verdict's evidence says, exit code)
MATRIX = {
    "exception": (None, "script-error", "RuntimeError: injected fault in worker:1", 1),
    "sigkill": (None, "infrastructure", "signal SIGKILL (exit 137)", 137),
    "sigsegv": (None, "crash", "signal SIGSEGV (exit 139)", 139),
    "oom": (_oom, "out-of-memory", "signal SIGKILL (exit 137)", 137),
    "disk-full": (_disk_full, "disk-full", "No space left on device", 1),
    "stuck-in-step": (None, "hang", "sends no progress samples", 124),
    # (blocked inside a step, alive and sampling, named by the arrival counts of tfrun's
    # exchange: tests/integration/test_hangs.py's stuck worker asserts the same evidence,
    # and tests/unit/test_decision_table.py the rule)
    "before-strategy": (None, "never-joined", "never started its TensorFlow server", 124),
    "import": (None, "script-error",
               "ModuleNotFoundError: No module named 'tfrun_fault_matrix_missing_module'", 1),
}


#: the cluster forms in about 4 s here: the row that never forms it need not wait 40
FLAGS_OF = {"before-strategy": ("--join-timeout", "15"),
            # the allocation (a callback, to the step limit) reclaims the cgroup's pages
            # before the kernel kills it: under load that took more than 10 s in CI, which
            # is a hang at this table's --step-timeout
            "oom": ("--step-timeout", "120")}


@pytest.mark.parametrize("fault", list(MATRIX))
def test_the_first_failure_is_named_with_its_class_and_the_other_task_is_collateral(
        tmp_path, fault):
    how, failure_class, evidence, code = MATRIX[fault]
    run = how(tmp_path) if how else _run_fault(tmp_path, fault, flags=FLAGS_OF.get(fault, ()))
    assert run.proc.returncode == code, run.stdout[-5000:]
    verdict = run.summary["verdict"]
    assert (verdict["task"], verdict["host"], verdict["class"]) == \
        ("worker:1", "localhost", failure_class), (verdict, run.stdout[-5000:])
    assert evidence in verdict["what"], verdict
    assert verdict["meaning"]
    assert [c["task"] for c in verdict["collateral"]] == ["worker:0"], verdict
    assert {t["task"]: t["blame"] for t in run.summary["tasks"]} == \
        {"worker:0": "collateral", "worker:1": "root cause"}
    assert f"first failure: worker:1 on localhost: {failure_class}, " in run.stdout
    # Named before worker:0 is stopped: the verdict comes first, the stop after it.
    events = run.events()
    named = next(i for i, e in enumerate(events) if e["event"] == "verdict")
    stops = [i for i, e in enumerate(events) if e["event"] == "state"
             and e["task"] == "worker:0" and e["new"] == "stopped"]
    assert all(named < i for i in stops), events[named - 3:]
    assert verdict["named_after_seconds"] >= 0 and verdict["detected_at"] <= verdict["named_at"]
    if fault == "sigsegv":
        # The crash's evidence: faulthandler's dump of the crashing thread (the bootstrap
        # enables it), shown as the root cause's traceback.
        root = run.summary["root_cause"]
        assert root["traceback"].startswith("Fatal Python error: Segmentation fault"), root
        assert "Current thread" in root["traceback"] and \
            "in on_train_batch_end" in root["traceback"], root["traceback"]
        assert "  class: crash (a fatal signal of its own making" in run.stdout
        page = (run.run_dir / "report.html").read_text()
        findings = page.split("<h2>Findings</h2>")[1].split("<h2>")[0]
        assert "<b>First failure</b>: worker:1 (host localhost): crash, signal SIGSEGV" \
            in findings and "collateral: worker:0 (host localhost)" in findings, findings
    assert_nothing_left(run)
