"""A stuck worker is found by progress, named with its stack, and the other labelled as
waiting for it; a worker whose CPU another process shares is named as a straggler while the
run goes on (issue 44: tfrun.launch.supervise.hang and .stragglers, tfrun.in_task.measure.progress
and .contention)."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPORT_ON, Run, assert_nothing_left

pytestmark = pytest.mark.tf

SCRIPT = "tests/scripts/stuck_worker.py"


def _assert_the_stuck_worker_is_named(run: Run, flavour: str, limit: float) -> None:
    assert "worker:1: stuck in a callback after step 30" in run.stdout
    hang = run.summary["hang"]
    assert hang["limit_seconds"] == limit
    # Samples come every 2 s: the hang is declared within a few seconds of the limit
    # (idle_seconds is rounded to 0.1 s: just over the limit reads as the limit).
    assert limit <= hang["idle_seconds"] <= limit + 10, hang
    assert [(c["task"], c["steps_done"], c["doing"]) for c in hang["culprits"]] \
        == [("worker:1", 30, "callbacks")]
    assert hang["culprits"][0]["host"]
    # The evidence: worker:0 waits inside an all-reduce of tfrun's exchange that worker:1
    # never entered (issue 44.2's arrival counts).
    (waiting,) = hang["waiting"]
    assert (waiting["task"], waiting["doing"]) == ("worker:0", "a training step"), waiting
    assert re.fullmatch(r"waiting in all-reduce #\d+ for worker:1", waiting["why"]), waiting
    assert "never arrived at all-reduce #" in hang["culprits"][0]["why"]
    assert run.summary["root_cause"]["task"] == "worker:1"
    assert run.tasks()["worker:1"]["note"].startswith("hang culprit: stuck in callbacks")
    # The console names it, then shows one stack: its main thread, the script's frames
    # first, tfrun's folded; the raw dumps (every thread of every task) stay in the logs.
    assert "the culprit: worker:1" in run.stdout
    stack = run.stdout.split("worker:1's Python stack, its main thread")[1]
    stack = stack.split("the others' stacks: ")[0]
    assert "stuck_worker.py" in stack and "on_train_batch_end" in stack, stack[:3000]
    assert re.search(r"\(\d+ frames? of tfrun\)", stack), stack[:3000]
    assert "(most recent call first)" not in run.stdout, run.stdout[-5000:]
    assert "worker:0 in " in run.stdout.split("the others' stacks: ")[1]
    assert "(most recent call first)" in (run.run_dir / "logs" / "worker-1.log").read_text()
    if flavour == "2":  # (one report is enough: the page, not the flavour, is under test)
        page = (run.run_dir / "report.html").read_text()
        findings = page.split("<h2>Findings</h2>")[1].split("<h2>")[0]
        assert "<b>Hang</b>" in findings and "the culprit: worker:1" in findings, findings
        assert re.search(r"waiting in all-reduce #\d+ for worker:1", findings), findings
        # the step-rate chart: both tasks drew steps, then the span with none is shaded
        assert (run.run_dir / "report" / "step_rates.png").stat().st_size > 5000
    assert_nothing_left(run)


def test_a_worker_stuck_in_its_callback_is_named_with_its_stack(tmp_path):
    """tf_keras, with --step-timeout 15 (the default limit, max(60 s, 20x the median step),
    is a row of tests/unit/test_decision_table.py; a run that waits a minute for it showed
    nothing more). Samples every
    0.5 s: the report's step-rate chart needs two during the 30 steps, which a task forked
    on a quiet machine ran between its first two samples at the default 2 s (no chart)."""
    run = Run(tmp_path, ["--workers", "2", "--keras", "2", "--step-timeout", "15", SCRIPT,
                         "worker:1", "30"], env={"TF_USE_LEGACY_KERAS": "1", **REPORT_ON,
                                                 "TFRUN_METRICS_INTERVAL": "0.5"})
    assert run.run(timeout=400) == 124, run.stdout[-5000:]
    _assert_the_stuck_worker_is_named(run, "2", 15.0)


def test_a_hang_with_restarts_left_restarts_the_group_which_then_finishes(tmp_path):
    """Issue 44.2: the restart policy acts on the class hang: with --max-restarts 1, the
    hang (worker:1 stuck in the first attempt only) stops and restarts the group, charged
    to --max-restarts, and the second attempt trains through."""
    run = Run(tmp_path, ["--workers", "2", "--step-timeout", "15", "--max-restarts", "1",
                         SCRIPT, "worker:1", "30", "60", "once"])
    assert run.run(timeout=400) == 0, run.stdout[-5000:]
    assert "restarting the whole group after the hang (restart 1 of 1)" in run.stdout
    assert run.stdout.count("trained") >= 2  # both workers, in the second attempt
    first, second = run.summary["attempts"]
    assert (first["ended"], first["failure_class"], first["task"]) == \
        ("restart", "hang", "worker:1"), first
    assert [c["task"] for c in first["hang"]["culprits"]] == ["worker:1"]
    assert second["ended"] == "success" and run.summary["restarts"] == 1
    assert_nothing_left(run)


def test_a_slow_checkpoint_the_script_s_own_work_and_a_slow_first_step_are_no_hang(tmp_path):
    """CI called a clean run hung in its third fit's tracing: the step limit counted from
    the last step of the fit before, through the script's evaluate(), predict() and new
    model. A Keras ModelCheckpoint's save, a pause after training and a fit's first step,
    each longer than --step-timeout, are no hang (on the code before: exit 124)."""
    # Samples every 0.5 s: with the default 2 s, a sample in a short phase just before a
    # long one would be read as 2 s of silence before the next one came.
    run = Run(tmp_path, ["--workers", "1", "--step-timeout", "3",
                         "tests/scripts/pause_between_fits.py", "5", "5", "5"],
              env={"TFRUN_METRICS_INTERVAL": "0.5"})
    assert run.run(timeout=300) == 0, run.stdout[-5000:]
    assert "trained twice" in run.stdout
    assert run.summary.get("hang") is None, run.summary["hang"]
    # The run's own record of it: the new fit's first step was seen as such.
    samples = [json.loads(line) for line in
               (run.run_dir / "metrics" / "worker-0.jsonl").read_text().splitlines()]
    doing = {s.get("doing") for s in samples}
    assert "the first step of a fit (tracing)" in doing, doing
    assert "the ModelCheckpoint callback (a checkpoint)" in doing, doing
    assert_nothing_left(run)


STEADY = "tests/scripts/steady_steps.py"


def _straggler_named(run: Run, timeout: float) -> dict:
    """The run's first ``straggler`` event, waited for while it runs."""
    deadline = time.monotonic() + timeout
    while True:
        found = [e for e in run.events() if e["event"] == "straggler"] \
            if (run.run_dir / "events.jsonl").exists() else []
        if found:
            return found[0]
        assert run.proc.poll() is None, run._output()[-3000:]
        assert time.monotonic() < deadline, run._output()[-3000:]
        time.sleep(0.5)


@pytest.mark.alone
@pytest.mark.parametrize("width, step", [(600, "10 ms"), (5000, "0.5 s")])
def test_a_worker_sharing_its_cpu_with_another_process_is_named_a_straggler_within_50_steps(
        tmp_path, width, step):
    """A busy loop (no tfrun in it) pinned to worker:1's CPU, tfrun's default settings, a
    400-step job: worker:1 is named within 50 of its steps, about 2x slower, with the cause,
    whether a step takes about 10 ms (the whole job, about 8 s) or about half a second (the
    job is stopped with Ctrl-C once worker:1 is named: its 400 steps would take minutes)."""
    cpu = sorted(os.sched_getaffinity(0))[1]  # --cpus-per-task 1 places worker:1 there
    competitor = subprocess.Popen(["taskset", "-c", str(cpu), sys.executable, "-c",
                                   "while True: pass"])
    slowed = Run(tmp_path, ["--workers", "2", "--cpus-per-task", "1", STEADY, "400",
                            str(width)], env=REPORT_ON, name="slowed")
    try:
        slowed.start(console=tmp_path / "console.txt")
        named = _straggler_named(slowed, 300)
        if step == "10 ms":
            assert slowed.wait(300) == 0, slowed.stdout[-3000:]
        else:
            slowed.proc.send_signal(signal.SIGINT)
            assert slowed.wait(120) == 130, slowed.stdout[-3000:]
    finally:
        competitor.kill()
        competitor.wait()
    # its CPUs taken (over a second of samples: the slow steps' evidence), or, within
    # the first second of fast steps, its threads waiting for the CPU the busy loop holds
    assert named["task"] == "worker:1" and named["cause"] in ("cpu-taken", "cpu-wait"), named
    assert named["slower"] >= 1.3 and 0 < named["steps_done"] <= 50, named
    assert f"placement  : worker:0 CPU {sorted(os.sched_getaffinity(0))[0]}, worker:1 CPU {cpu}" \
        in slowed.stdout
    findings = slowed.summary["stragglers"]
    assert [f["task"] for f in findings] == ["worker:1"], findings
    assert "straggler: worker:1 (host " in slowed.stdout
    assert "no straggler any more" not in slowed.stdout, slowed.stdout[-3000:]
    assert_nothing_left(slowed)
    if step != "10 ms":
        return
    page = (slowed.run_dir / "report.html").read_text()
    assert "<b>Straggler</b>: worker:1 (host " in page.split("<h2>Numbers</h2>")[0], page[:3000]
    from tfrun.launch.results.report import load_run
    from tfrun.launch.results.report_progress import plot_step_rates

    steps, others = plot_step_rates(load_run(slowed.run_dir)).axes
    rates = {l.get_label(): l.get_ydata() for l in steps.get_lines()}
    assert sorted(rates) == ["worker:0", "worker:1"] and max(rates["worker:1"]) > 0
    taken = {l.get_label(): sorted(l.get_ydata()) for l in others.get_lines()}
    median = {task: values[len(values) // 2] for task, values in taken.items()}
    assert median["worker:1"] > median["worker:0"] + 0.2, median  # the chart shows who


@pytest.mark.alone
def test_a_clean_run_of_fast_steps_names_no_straggler(tmp_path):
    """The same 400 steps of about 10 ms with nothing beside them, tfrun's default
    settings but for the workers sharing both CPUs (``--cpus-per-task 0``; by default each
    is pinned to one, and a CPU that serves more of the machine's other processes -- the
    launcher, the engine tests' daemons -- makes its worker slower every step: CI named
    worker:0 so, 1.4x, near the end of a run); samples come every few steps, and nobody is
    named."""
    clean = Run(tmp_path, ["--workers", "2", "--cpus-per-task", "0", STEADY, "400", "600"],
                env=REPORT_ON, name="clean")
    assert clean.run(300) == 0, clean.stdout[-3000:]
    assert clean.summary["stragglers"] == [] and "straggler:" not in clean.stdout
    assert "without forming a cluster" not in clean.stdout  # a real cluster formed
    assert "<h2>Findings</h2>" not in (clean.run_dir / "report.html").read_text()
    assert_nothing_left(clean)


@pytest.mark.alone
@pytest.mark.parametrize("fault, cause, words", [
    ("slow-input", "input-wait", ": it waits, most likely for its input (a slow disk"),
    ("busy-input", "compute", "more CPU time a step: it computes more"),
])
def test_a_worker_with_a_slower_input_pipeline_is_named_a_straggler_by_its_own_work(
        tmp_path, fault, cause, words):
    """Issue 44.3's other causes: worker:1's input takes 50 ms more per batch (in its
    tf.data map: nothing tfrun knows of), its CPU is its own. The arrival records of
    tfrun's exchange show worker:0 waiting in every all-reduce for it: worker:1 is named
    within 50 steps, and nobody else (the clean run is the test above). A sleep (a slow
    disk) is input-wait: its extra time is no CPU time; a busy loop (a heavy decode) is
    compute."""
    run = Run(tmp_path, ["--workers", "2", "--cpus-per-task", "1", "tests/scripts/fault.py",
                         fault, "worker:1", "150"])
    assert run.run(300) == 0, run.stdout[-3000:]
    findings = run.summary["stragglers"]
    assert [(f["task"], f["cause"]) for f in findings] == [("worker:1", cause)], findings
    assert findings[0]["slower"] >= 1.3 and findings[0]["steps_done"] <= 50, findings
    assert "straggler: worker:1 (host localhost) runs about " in run.stdout
    assert words in run.stdout, run.stdout[-3000:]
    assert_nothing_left(run)
