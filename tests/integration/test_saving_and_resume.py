"""Tier 3 + fault injection: chief-aware saving and exact resume across a gang restart."""

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import KILL_EPOCHS, ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf
SCRIPT = str(ROOT / "tests" / "scripts" / "resume.py")


def weights(path):
    data = np.load(path)
    return [data[f"arr_{i}"] for i in range(4)], data


# Keras 3's is the quick tier's real 2-worker run (-m quick): TF_CONFIG, the cluster, a
# crash, the backup and the exact resume in one test.
@pytest.mark.parametrize("flavour", [pytest.param("3", marks=pytest.mark.quick), "2"],
                         ids=["keras3", "tf_keras"])
def test_worker_crash_restart_resumes_exactly_and_saves_once(tmp_path, flavour):
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "2" else {}
    clean = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--quiet-tasks", SCRIPT,
                           str(tmp_path / "clean"), "-1"], env=env, name="clean")
    assert clean.run(300) == 0, clean.stdout[-3000:]
    crashed = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--max-restarts", "1",
                             "--quiet-tasks", SCRIPT, str(tmp_path / "crashed"), "1"], env=env,
                  name="crashed")
    assert crashed.run(300) == 0, crashed.stdout[-3000:]
    assert crashed.summary["restarts"] == 1
    restart_event = next(e for e in crashed.events() if e["event"] == "restart")
    assert restart_event["cause"] == "worker:1" and restart_event["exit_code"] == 17

    want, _ = weights(tmp_path / "clean-worker-0.npz")
    for i in range(2):
        got, data = weights(tmp_path / f"crashed-worker-{i}.npz")
        # The second attempt resumed after the backed-up epoch 1: it ran epochs 2 and 3 only.
        assert list(data["epochs_run"]) == [2, 3]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-6)

    # tfrun.save: exactly one model file, written by the chief (worker:0), which loads.
    for run in (clean, crashed):
        saved = glob.glob(str(run.run_dir / "**" / "model.keras"), recursive=True)
        assert saved == [str(run.run_dir / "output" / "model.keras")]
    assert str(np.load(tmp_path / "clean-worker-1.npz")["saved"]) == ""
    # tf.keras is tf_keras when TF_USE_LEGACY_KERAS=1 (flavour 2), Keras 3 otherwise.
    check = ("import sys, numpy as np, tensorflow as tf; m = tf.keras.models.load_model(sys.argv[1]); "
             "print(m.predict(np.zeros((1, 6), 'float32'), verbose=0).shape)")
    loaded = subprocess.run([sys.executable, "-c", check, str(clean.run_dir / "output" / "model.keras")],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert loaded.returncode == 0 and "(1, 2)" in loaded.stdout, loaded.stderr[-2000:]
    assert_nothing_left(crashed)


KILL_SCRIPT = str(ROOT / "tests" / "scripts" / "backup_kill.py")


def _latest_backup(run, task: str) -> int:
    from tfrun.in_task.backup import complete_epochs

    return max(complete_epochs(str(run.run_dir / "backup" / task)), default=0)


def _running_pid(run, task: str) -> int:
    starts = [e for e in run.events() if e["event"] == "state" and e["task"] == task
              and e["new"] == "running"]
    return starts[-1]["pid"]


def _started_in_this_attempt(run) -> bool:
    """Whether both workers of the run's current attempt have started: after a restart,
    until they have, the last "running" pid of a task is the killed attempt's."""
    events = run.events()
    restart = max((i for i, e in enumerate(events) if e["event"] == "restart"), default=-1)
    started = {e["task"] for e in events[restart + 1:]
               if e["event"] == "state" and e["new"] == "running"}
    return started >= {"worker:0", "worker:1"}


def _restarts(run) -> int:
    return sum(1 for e in run.events() if e["event"] == "restart")


@pytest.mark.slow
def test_ten_random_kills_resume_exactly_from_the_last_complete_backup(
        tmp_path, backup_kill_reference):
    """Issue 14.2: SIGKILL a worker 10 times (half of the kills aimed just after worker:0's
    epoch-end backup, while worker:1's is still pending); every resume is consistent and
    the final weights equal an uninterrupted run's (Keras 3, Adam: optimizer state too)."""
    import random
    import signal
    import time

    # 28 epochs: each kill costs the run 1-2 epochs of progress, so 10 kills fit with room
    epochs, slow = str(KILL_EPOCHS), "0.6"

    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    run = Run(tmp_path, ["--workers", "2", "--max-restarts", "10", "--stop-grace", "2",
                         "--quiet-tasks", KILL_SCRIPT, str(tmp_path / "killed"), epochs, slow],
              name="killed").start()
    trials, seen = [], 0
    for trial in range(10):
        deadline = time.monotonic() + 120
        # Training resumed and moved on. (The killed attempt's worker:0 can still finish a
        # backup before tfrun stops it: progress alone does not mean the new attempt runs.)
        while _latest_backup(run, "worker-0") <= seen or not _started_in_this_attempt(run):
            assert run.proc.poll() is None, f"seed {seed}: run ended after {trials}: " \
                                             f"{run.proc.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, f"seed {seed}: no progress after {trials}"
            time.sleep(0.02)
        if trial % 2 == 0:   # aimed: inside the 0.6 s between the two workers' backups
            time.sleep(rng.uniform(0.0, 0.4))
            victim = "worker:1"
        else:                # anywhere
            time.sleep(rng.uniform(0.0, 1.5))
            victim = rng.choice(["worker:0", "worker:1"])
        os.kill(_running_pid(run, victim), signal.SIGKILL)
        backed_up = (_latest_backup(run, "worker-0"), _latest_backup(run, "worker-1"))
        trials.append((victim, backed_up))
        seen = max(backed_up)
        deadline = time.monotonic() + 60
        while _restarts(run) < trial + 1:
            assert time.monotonic() < deadline, f"seed {seed}: no restart after kill {trial}"
            time.sleep(0.05)
    assert run.wait(600) == 0, f"seed {seed}, trials {trials}: {run.stdout[-3000:]}"
    in_window = [t for t in trials if t[1][0] != t[1][1]]
    assert len(in_window) >= 3, f"seed {seed}: only {len(in_window)} kills in the window: {trials}"
    assert run.summary["restarts"] == 10

    want, _ = weights(backup_kill_reference / "clean-worker-0.npz")
    for i in range(2):
        got, _ = weights(tmp_path / f"killed-worker-{i}.npz")
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"seed {seed}, trials {trials}")
    for i in range(2):
        log = (run.run_dir / "logs" / f"worker-{i}.log").read_text()
        assert "(complete on every worker)" in log
    assert_nothing_left(run)


@pytest.mark.slow
def test_tfrun_stopped_then_the_same_command_again_resumes_from_the_backups(
        tmp_path, backup_kill_reference):
    """SIGTERM to tfrun (a preempted or requeued job) with the coordinated preemption save
    off (preemption_check=0: the tasks end at once, as with tf_keras), then the same
    command, the same run dir: it resumes from the newest epoch every worker backed up and
    ends with an uninterrupted run's weights (Keras 3, MWMS, Adam)."""
    import signal
    import time

    epochs, slow = "6", "0.3"

    def launch():
        return Run(tmp_path, ["--workers", "2", "--quiet-tasks", KILL_SCRIPT,
                              str(tmp_path / "stopped"), epochs, slow, "0"], name="stopped")

    first = launch().start()
    deadline = time.monotonic() + 300
    while min(_latest_backup(first, "worker-0"), _latest_backup(first, "worker-1")) < 2:
        assert first.proc.poll() is None, first.proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "no backup of epoch 2"
        time.sleep(0.05)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(60) == 143, first.stdout[-3000:]
    assert first.summary["status"] == "interrupted"

    again = launch()
    assert again.run(600) == 0, again.stdout[-3000:]
    assert "(resumes the run that ended: interrupted)" in again.stdout
    for i in range(2):
        log = (again.run_dir / "logs" / f"worker-{i}.log").read_text()
        assert "resuming from the backup of epoch" in log, log[-2000:]
        assert "tfrun: preempted:" not in log
    want, _ = weights(backup_kill_reference / f"clean-worker-0-epoch{epochs}.npz")
    for i in range(2):
        got, _ = weights(tmp_path / f"stopped-worker-{i}.npz")
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert_nothing_left(again)


STEP_SCRIPT = str(ROOT / "tests" / "scripts" / "step_backup.py")


#: iterator numbers input_position.py's resumes report, per Keras flavour: Keras 3 makes 2
#: iterators per epoch; tf_keras one unused first, then one per epoch, and it stops when a
#: finite input runs out instead of remaking it (the uninterrupted run does the same).
_ITERATORS = {"3": {"reshuffled-epochs": "iterator 5 of the dataset, 4 batches",
                    "repeated-steps-per-epoch": "iterator 1 of the dataset, 16 batches",
                    "finite-steps-per-epoch": "iterator 1 of the dataset, 8 batches",
                    # Keras 3 resumes after the epoch's last batch and runs the epoch's end
                    "reshuffled-epochs-stopped-at-an-epoch-end":
                        "at epoch 2, after its batch 10 (global step 20), from the backup "
                        "(complete on every worker); the input is put back where it was "
                        "(iterator 3 of the dataset, 10 batches",
                    "repeated-steps-per-epoch-stopped-at-an-epoch-end":
                        "at epoch 2, after its batch 8 (global step 16), from the backup "
                        "(complete on every worker); the input is put back where it was "
                        "(iterator 1 of the dataset, 16 batches"},
              "2": {"reshuffled-epochs": "iterator 4 of the dataset, 4 batches",
                    "repeated-steps-per-epoch": "iterator 1 of the dataset, 16 batches",
                    "finite-steps-per-epoch": "iterator 1 of the dataset, 8 batches",
                    # tf_keras would run an epoch of no steps and refuse it: the next one
                    "reshuffled-epochs-stopped-at-an-epoch-end":
                        "from the backup of epoch 2 (complete on every worker); the input is "
                        "put back where it was (iterator 4 of the dataset, 0 batches",
                    "repeated-steps-per-epoch-stopped-at-an-epoch-end":
                        "from the backup of epoch 2 (complete on every worker); the input is "
                        "put back where it was (iterator 1 of the dataset, 16 batches"}}


@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_the_input_is_put_back_where_it_was_in_every_epoch_form(tmp_path, flavour):
    """Issue 32: a fit stopped mid-epoch and resumed from save_freq=4 backups ends with the
    uninterrupted run's weights for a dataset reshuffled each epoch with a seed (Keras'
    earlier iterators are made and dropped first), an endless one with steps_per_epoch
    (one iterator across epochs: the resume reads past 2 epochs and more) and a finite one
    shorter than epochs x steps_per_epoch; and, for the first two, a fit stopped right
    after an epoch's last step (a preemption checked there: tf_keras refused to resume at
    that step, "Empty logs", in a CI run). One process, each flavour's plain
    loop. The shuffle order matters: another seed gives other weights."""
    env = {**os.environ, "TF_USE_LEGACY_KERAS": "1" if flavour == "2" else "0"}
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "scripts" / "input_position.py"),
                          str(tmp_path)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    forms = {row["form"]: row for row in map(json.loads, (
        line for line in out.stdout.splitlines() if line.startswith("{")))}
    assert set(forms) == set(_ITERATORS[flavour]), out.stdout
    for row in forms.values():
        assert row["resumed_vs_uninterrupted"] <= 1e-6, row
        assert row["other_shuffle_vs_uninterrupted"] > 1e-3, row
        assert "the input is put back where it was" in row["printed"], row
        assert _ITERATORS[flavour][row["form"]] in row["printed"], row


def _steps(path) -> list[tuple[int, int]]:
    """(restart count, global step) per trained batch, from step_backup.py's log."""
    return [tuple(map(int, line.split())) for line in open(path).read().splitlines()]


@pytest.fixture(scope="module", params=["3", "2"], ids=["keras3", "tf_keras"])
def uninterrupted(request, step_backup_reference):
    """The reference: step_backup.py's 3 epochs without an interruption, per Keras flavour
    (the directory and the flavour: the tests using it run once per flavour; the run is
    the session's, shared with the elastic fake-host tests)."""
    return step_backup_reference(request.param), request.param


def test_step_backups_resume_mid_epoch_exactly_after_a_sigkill(tmp_path, uninterrupted):
    """Issue 32: save_freq=10, 3 epochs x 30 steps; worker:1 SIGKILLed mid-epoch 2 (after
    global step 45). The gang restarts, resumes at the newest step backup every worker
    completed (inside epoch 2, its first batches read and skipped), redoes at most 10
    steps, and ends with the weights of an uninterrupted run (both Keras flavours, MWMS,
    Adam). The uninterrupted run is the shared one (saving every 1000 steps trains the same)."""
    import signal
    import tempfile
    import time

    reference, flavour = uninterrupted
    started = time.time() - 1
    run = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--max-restarts", "1", STEP_SCRIPT,
                         str(tmp_path / "killed"), "3", "10", "0.05"], name="killed").start()
    log = tmp_path / "killed-steps-worker-0.log"
    deadline = time.monotonic() + 300
    while not log.exists() or max((s for _, s in _steps(log)), default=0) < 45:
        assert run.proc.poll() is None, run.proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, "worker:0 never reached step 45"
        time.sleep(0.02)
    os.kill(_running_pid(run, "worker:1"), signal.SIGKILL)
    assert run.wait(600) == 0, run.stdout[-3000:]
    assert _restarts(run) == 1
    steps = _steps(log)
    trained_before = max(s for r, s in steps if r == 0)
    resumed_at = min(s for r, s in steps if r == 1)
    assert 45 <= trained_before < 60  # killed inside epoch 2 (steps 31-60)
    redone = trained_before - resumed_at + 1
    assert 0 <= redone <= 10, (trained_before, resumed_at)
    # the resume started inside epoch 2, not at its first step
    assert resumed_at > 31 and (resumed_at - 1) % 10 == 0, resumed_at
    # Issue 72: the ledger counts the steps this test counts, and adds up to the wall time
    # (the uninterrupted reference's too, with nothing redone)
    assert run.summary["goodput"]["steps_redone"] == redone, run.summary["goodput"]
    assert_ledger_adds_up(run.summary)
    assert re.search(r"goodput \d+%: ", run.stdout), run.stdout[-2000:]
    clean = json.loads((reference / "clean" / "summary.json").read_text())
    assert clean["goodput"]["steps_redone"] == 0 and clean["goodput"]["goodput"] > 0
    assert_ledger_adds_up(clean)
    for i in range(2):
        worker_log = (run.run_dir / "logs" / f"worker-{i}.log").read_text()
        assert "tfrun: resuming at epoch 2, after its batch" in worker_log, worker_log[-2000:]
    want = np.load(reference / "clean-worker-0.npz")
    for i in range(2):
        got = np.load(tmp_path / f"killed-worker-{i}.npz")
        for k in range(4):
            np.testing.assert_allclose(got[f"arr_{k}"], want[f"arr_{k}"], atol=1e-6, rtol=0)
    assert_nothing_left(run)
    # The killed worker's autograph files (TensorFlow removes them at a normal exit only)
    # went with the run's temporary directory: none in the one tfrun itself uses.
    left = [f for f in Path(tempfile.gettempdir()).glob("__autograph_generated_file*.py")
            if f.stat().st_mtime >= started]
    assert not left, left


def _saved_step(output: str) -> int:
    found = {int(m) for m in re.findall(r"tfrun: preempted: every worker saved at step (\d+)",
                                        output)}
    assert len(found) == 1, output[-3000:]  # one step, the same for every worker
    return found.pop()


def _wait_for_step(run, log, step: int) -> None:
    import time

    deadline = time.monotonic() + 300
    while not log.exists() or max((s for _, s in _steps(log)), default=0) < step:
        assert run.proc.poll() is None, run.proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"worker:0 never reached step {step}"
        time.sleep(0.02)


def _assert_same_weights(tmp_path, name: str, clean: str) -> None:
    want = np.load(tmp_path / f"{clean}-worker-0.npz")
    for i in range(2):
        got = np.load(tmp_path / f"{name}-worker-{i}.npz")
        for k in range(4):
            np.testing.assert_allclose(got[f"arr_{k}"], want[f"arr_{k}"], atol=1e-6, rtol=0)


def test_a_worker_without_the_backups_gets_the_state_from_its_peer(tmp_path, uninterrupted):
    """Issue 43.3: each task's backups are its own (as on hosts with their own disks), and
    worker:1 comes back from a SIGKILL with none (a spare). The newest backup worker:0 holds
    is the resume point; worker:0 sends its state and the input position over the cluster
    (not a start from step 0), at most save_freq steps are redone, and the final weights
    equal an uninterrupted run's (both Keras flavours)."""
    import signal

    reference, flavour = uninterrupted
    run = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--max-restarts", "1", STEP_SCRIPT,
                         str(tmp_path / "spare"), "3", "10", "0.05", "--private-backups"],
              name="spare").start()
    log = tmp_path / "spare-steps-worker-0.log"
    _wait_for_step(run, log, 45)
    os.kill(_running_pid(run, "worker:1"), signal.SIGKILL)
    assert run.wait(600) == 0, run.stdout[-3000:]
    steps = _steps(log)
    trained_before = max(s for r, s in steps if r == 0)
    resumed_at = min(s for r, s in steps if r == 1)
    assert 0 <= trained_before - resumed_at + 1 <= 10 and (resumed_at - 1) % 10 == 0, steps
    logs = [(run.run_dir / "logs" / f"worker-{i}.log").read_text() for i in range(2)]
    assert "lost my backups" in logs[1]
    assert "tfrun: sending the backup of epoch 2, after batch" in logs[0], logs[0][-3000:]
    assert ("tfrun: this worker has no backup of epoch 2, after batch "
            f"{(resumed_at - 1) - 30} (its own newest: none): its state came from replica 0 "
            "over the cluster") in logs[1], logs[1][-3000:]
    assert "starting from the beginning" not in logs[0] + logs[1]
    want = np.load(reference / "clean-worker-0.npz")
    for i in range(2):
        got = np.load(tmp_path / f"spare-worker-{i}.npz")
        for k in range(4):
            np.testing.assert_allclose(got[f"arr_{k}"], want[f"arr_{k}"], atol=1e-6, rtol=0)
    assert_nothing_left(run)


def test_sigterm_to_a_worker_saves_everyone_at_one_step_and_costs_no_restart(
        tmp_path, uninterrupted):
    """Issue 32: a worker preempted mid-epoch (SIGTERM from outside): at the next check
    every worker backs up at the same step and stops (exit 143); tfrun restarts them
    without using --max-restarts 0, the resume redoes no step, and the weights equal an
    uninterrupted run's. No periodic step backups (save_freq=1000): the save is the
    preemption's (checked every 10 steps here; the next test uses the default, "auto")."""
    import shutil
    import signal

    reference, flavour = uninterrupted
    shutil.copy(reference / "clean-worker-0.npz", tmp_path / "clean-worker-0.npz")
    run = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--max-restarts", "0", STEP_SCRIPT,
                         str(tmp_path / "preempted"), "3", "1000", "0.05", "10"],
              name="preempted").start()
    log = tmp_path / "preempted-steps-worker-0.log"
    _wait_for_step(run, log, 42)
    os.kill(_running_pid(run, "worker:1"), signal.SIGTERM)
    assert run.wait(600) == 0, run.stdout[-3000:]
    assert _restarts(run) == 1 and run.summary["preemptions"] == 1
    saved = _saved_step(run.stdout)
    steps = _steps(log)
    resumed_at = min(s for r, s in steps if r == 1)
    # The backup is at the check step every worker reached (the log's callback runs after
    # the one that stopped, so the last logged step may be one before it).
    assert saved % 10 == 0 and 42 <= saved <= 60, saved
    assert max(s for r, s in steps if r == 0) in (saved - 1, saved)
    assert resumed_at == saved + 1, steps[-20:]  # nothing redone
    # tfrun says where the preemption left training, and the attempts record it
    assert f"preempted at step {saved}: backed up there; the restart resumes" in run.stdout
    first, second = run.summary["attempts"]
    assert first["failure_class"] == "preempted" and first["preempted_at_step"] == saved
    assert second["resumed_at_step"] == saved and "preempted_at_step" not in second
    for i in range(2):
        worker_log = (run.run_dir / "logs" / f"worker-{i}.log").read_text()
        assert f"tfrun: preempted: every worker saved at step {saved}" in worker_log
        # tfrun's own eager collectives (the stop checks, the agreement on a backup) add
        # no TensorFlow advice to run them in a tf.function (10 lines a run, before)
        assert "eagerly has significant overhead" not in worker_log
        # (a backup after epoch 2's last step: tf_keras resumes at the next epoch's start)
        resumed = ("tfrun: resuming from the backup of epoch 2" if saved == 60 and flavour == "2"
                   else "tfrun: resuming at epoch 2, after its batch")
        assert resumed in worker_log, worker_log[-3000:]
    _assert_same_weights(tmp_path, "preempted", "clean")
    assert_nothing_left(run)


def test_sigterm_to_tfrun_saves_then_the_same_command_resumes_at_that_step(
        tmp_path, uninterrupted):
    """Issue 32: SIGTERM to tfrun (the whole job preempted): the tasks back up at one step
    (checked about once a second: preemption_check="auto") and stop, tfrun exits 143; the
    same command again resumes at that step (nothing redone) and ends with an
    uninterrupted run's weights."""
    import shutil
    import signal

    reference, flavour = uninterrupted
    shutil.copy(reference / "clean-worker-0.npz", tmp_path / "clean-worker-0.npz")

    def launch():
        return Run(tmp_path, ["--workers", "2", "--keras", flavour, STEP_SCRIPT,
                              str(tmp_path / "stopped"), "3", "1000", "0.05"], name="stopped")

    first = launch().start()
    log = tmp_path / "stopped-steps-worker-0.log"
    _wait_for_step(first, log, 42)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(120) == 143, first.stdout[-3000:]
    assert first.summary["status"] == "interrupted"
    first_wall = first.summary["ended_at"] - first.summary["started_at"]
    before = _steps(log)
    saved = _saved_step(first.stdout)
    assert max(s for _, s in before) in (saved - 1, saved)
    assert f"preempted at step {saved}: backed up there, and the same command" \
        in first.stdout, first.stdout[-3000:]
    assert first.summary["attempts"][-1]["preempted_at_step"] == saved
    again = launch()
    assert again.run(600) == 0, again.stdout[-3000:]
    assert again.summary["attempts"][-1]["resumed_at_step"] == saved
    second = [s for _, s in _steps(log)[len(before):]]
    assert second and second[0] == saved + 1, (saved, second[:3])  # nothing redone
    assert 42 <= saved < 90, saved  # stopped after the signal, before the end
    _assert_same_weights(tmp_path, "stopped", "clean")
    # Issue 72: the resumed run's ledger covers both launches, nothing redone; the time
    # between them is apart, and the report draws no line across it
    book = again.summary["goodput"]
    assert book["launches"] == 2 and book["steps_redone"] == 0, book
    launches = [first_wall, again.summary["ended_at"] - again.summary["started_at"]]
    assert abs(book["wall"] - sum(launches)) <= 0.05 * sum(launches), (book, launches)
    assert book["between_launches"] > 0 and abs(book["parts"]["unaccounted"]) <= 0.05 * book["wall"], book
    from tfrun.launch.results.report import load_run, plot_resources, write_report

    page = write_report(again.run_dir).read_text()
    assert "Where the time went" in page and (again.run_dir / "report" / "ledger.png").exists()
    data = load_run(again.run_dir)
    assert len(data.launch_breaks) == 1
    for line in plot_resources(data).axes[0].get_lines():  # each task's CPU over time
        assert np.isnan(line.get_ydata()).sum() == 1, line.get_ydata()  # a gap, no line
    assert_nothing_left(again)


def assert_ledger_adds_up(summary: dict) -> None:
    """The goodput ledger of one launch adds up to its wall time within 5%, its parts
    measured (the unaccounted rest within 5% too)."""
    book = summary["goodput"]
    wall = summary["ended_at"] - summary["started_at"]
    assert abs(book["wall"] - wall) <= 0.05 * wall, (book, wall)
    assert abs(book["parts"]["unaccounted"]) <= 0.05 * wall, book
    assert all(seconds >= 0 for part, seconds in book["parts"].items() if part != "unaccounted")
    assert book["parts"]["steps kept"] > 0 and book["parts"]["start-up"] > 0, book


@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_mirrored_in_one_process_sigterm_to_tfrun_then_the_same_command_resumes_at_that_step(
        tmp_path, flavour):
    """Issue 32, MirroredStrategy (one process, 2 CPU devices), both Keras flavours: SIGTERM
    to tfrun mid-epoch 2 backs up at one step and exits 143; the same command resumes at
    the next step and ends with the weights of an uninterrupted Mirrored run."""
    import signal

    def launch(name, slow):
        return Run(tmp_path, ["--devices", "2", "--strategy", "mirrored", "--keras", flavour,
                              STEP_SCRIPT, str(tmp_path / name), "3", "1000", slow], name=name)

    clean = launch("clean", "0")
    assert clean.run(300) == 0, clean.stdout[-3000:]
    first = launch("stopped", "0.1").start()
    log = tmp_path / "stopped-steps-worker-0.log"
    _wait_for_step(first, log, 40)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(120) == 143, first.stdout[-3000:]
    saved = _saved_step(first.stdout)
    assert 40 <= saved < 90, saved
    before = len(_steps(log))
    again = launch("stopped", "0")
    assert again.run(300) == 0, again.stdout[-3000:]
    second = [s for _, s in _steps(log)[before:]]
    assert second and second[0] == saved + 1, (saved, second[:3])  # nothing redone
    assert "the input is put back where it was" in \
        (again.run_dir / "logs" / "worker-0.log").read_text()
    want, got = np.load(tmp_path / "clean-worker-0.npz"), np.load(tmp_path / "stopped-worker-0.npz")
    for k in range(4):
        np.testing.assert_allclose(got[f"arr_{k}"], want[f"arr_{k}"], atol=1e-6, rtol=0)
    assert_nothing_left(again)
