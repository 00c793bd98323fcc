"""Tier 3 + fault injection: parameter-server training with roles handled by tfrun."""

import json
import re
import time

import pytest

from conftest import ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf
SCRIPT = str(ROOT / "tests" / "scripts" / "ps_fit.py")


def fit_result(run: Run) -> dict:
    line = next(l for l in run.stdout.splitlines() if "FIT_RESULT" in l)
    assert line.startswith("[chief:0]")  # the script ran on the coordinator only
    return json.loads(line.split("FIT_RESULT ", 1)[1])


def assert_trained_on_ps(result: dict, num_ps: int) -> None:
    assert result["strategy"] == "ParameterServerStrategyV2"
    losses = result["loss"]
    assert losses[-1] < losses[0] * 0.8, losses
    assert all(d.startswith("/job:ps/replica:0/task:") for d in result["devices"]), result["devices"]
    # Variables are spread round-robin over every ps.
    assert len({d.split("/task:")[1].split("/")[0] for d in result["devices"]}) == num_ps


def pid_of(run: Run, task: str) -> int:
    starts = [e for e in run.events() if e.get("task") == task and e.get("new") == "running"]
    return starts[-1]["pid"]


def wait_for_line(run: Run, log: str, text: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    path = run.run_dir / "logs" / log
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert run.proc.poll() is None, run.proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{text!r} never appeared in {log}"
        time.sleep(0.2)


@pytest.mark.parametrize("num_ps", [1, 2])
@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_chief_two_workers_and_ps_train_and_everything_exits(tmp_path, flavour, num_ps):
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "2" else {}
    run = Run(tmp_path, ["--keras", flavour, "--chief", "--workers", "2", "--ps", str(num_ps), SCRIPT],
              env=env)
    assert run.run(300) == 0, run.stdout[-3000:]
    result = fit_result(run)
    assert_trained_on_ps(result, num_ps)
    assert result["final"]["accuracy"] > 0.8
    tasks = run.tasks()
    assert tasks["chief:0"]["state"] == "succeeded"
    servers = [t for t in tasks if t != "chief:0"]
    assert len(servers) == 2 + num_ps
    assert all(tasks[t]["state"] == "stopped" and tasks[t]["stopped_by_tfrun"] for t in servers)
    assert "serving as a tf.distribute.Server" in (run.run_dir / "logs" / "ps-0.log").read_text()
    # Epoch-level callbacks ran on the coordinator: TensorBoard wrote its event files.
    assert list((run.run_dir / "output" / "tensorboard").rglob("events.out.tfevents.*"))
    assert_nothing_left(run)


def test_worker_sigkilled_mid_training_is_restarted_and_training_completes(tmp_path):
    """worker:1 SIGKILLed (charged to --max-worker-restarts 1), then worker:0 SIGTERMed
    from outside (preempted: restarted alone without a charge, though the budget is
    spent); the coordinator carries on and training completes."""
    run = Run(tmp_path, ["--chief", "--workers", "2", "--ps", "1", "--max-worker-restarts", "1",
                         SCRIPT, "12", "60"]).start()
    wait_for_line(run, "chief-0.log", "Epoch 3/12")
    import os
    import signal

    os.kill(pid_of(run, "worker:1"), signal.SIGKILL)
    wait_for_line(run, "chief-0.log", "Epoch 5/12")
    os.kill(pid_of(run, "worker:0"), signal.SIGTERM)
    assert run.wait(300) == 0, run.stdout[-3000:]
    result = fit_result(run)
    assert len(result["loss"]) == 12 and result["loss"][-1] < result["loss"][0]
    tasks = run.tasks()
    assert (tasks["worker:1"]["task_restarts"], tasks["worker:1"]["task_preemptions"]) == (1, 0)
    assert (tasks["worker:0"]["task_restarts"], tasks["worker:0"]["task_preemptions"]) == (0, 1)
    restarts = [e for e in run.events() if e["event"] == "task-restart"]
    assert [(e["task"], e["exit_code"], e["failure_class"]) for e in restarts] == [
        ("worker:1", 137, "infrastructure"), ("worker:0", 143, "preempted")]
    assert "preempted: not counted against --max-worker-restarts" in run.stdout
    assert_nothing_left(run)


def test_ps_sigkilled_mid_training_fails_with_ps_as_root_cause(tmp_path):
    run = Run(tmp_path, ["--chief", "--workers", "2", "--ps", "1", "--stop-grace", "5",
                         SCRIPT, "40", "60"]).start()
    wait_for_line(run, "chief-0.log", "Epoch 2/40")
    import os
    import signal

    os.kill(pid_of(run, "ps:0"), signal.SIGKILL)
    assert run.wait(120) == 137, run.stdout[-3000:]
    assert run.summary["root_cause"]["task"] == "ps:0"
    assert "FAILED: ps:0 exited with signal SIGKILL" in run.stdout
    assert_nothing_left(run)


BACKUP_SCRIPT = str(ROOT / "tests" / "scripts" / "ps_backup.py")


def _final_step(run: Run) -> int:
    return int(re.findall(r"FINAL_STEP (\d+)", run.stdout)[-1])


@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_ps_sigkilled_with_backups_restarts_and_resumes_from_the_last_epoch(tmp_path, flavour):
    """Issue 32 under PS (both Keras flavours, tfrun.fit): the coordinator backs the state up (read
    from the ps) at every epoch end; the ps SIGKILLed mid-run ends the attempt, the
    restart resumes from the newest epoch backup, and the run trains exactly
    epochs x steps steps in all (none lost, none counted twice)."""
    import os
    import signal

    run = Run(tmp_path, ["--chief", "--workers", "2", "--ps", "1", "--max-restarts", "1",
                         "--keras", flavour, BACKUP_SCRIPT, "6", "20", "0.3"]).start()
    wait_for_line(run, "chief-0.log", "epoch 3 begins")
    os.kill(pid_of(run, "ps:0"), signal.SIGKILL)
    assert run.wait(300) == 0, run.stdout[-3000:]
    assert run.summary["restarts"] == 1
    log = (run.run_dir / "logs" / "chief-0.log").read_text()
    resumed = re.findall(r"tfrun: resuming from the backup of epoch (\d+) \(the coordinator's\)",
                         log)
    assert resumed and int(resumed[0]) >= 2, log[-3000:]
    assert _final_step(run) == 6 * 20
    assert_nothing_left(run)


@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_sigterm_to_tfrun_under_ps_saves_at_the_epoch_end_then_the_same_command_resumes(
        tmp_path, flavour):
    """Issue 32 under PS: SIGTERM to tfrun stops the coordinator first; it waits for the
    epoch's scheduled steps, backs up there and exits 143 (then the ps and workers are
    stopped); tfrun exits 143 naming the step. The same command again resumes at the next
    epoch: nothing redone, nothing lost."""
    import signal

    def launch():
        return Run(tmp_path, ["--chief", "--workers", "2", "--ps", "1", "--keras", flavour,
                              BACKUP_SCRIPT, "6", "20", "0.3"], name="stopped")

    first = launch().start()
    wait_for_line(first, "chief-0.log", "epoch 3 begins")
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(120) == 143, first.stdout[-3000:]
    saved = {int(m) for m in re.findall(r"preempted at step (\d+): backed up there, and the same "
                                        r"command", first.stdout)}
    assert len(saved) == 1, first.stdout[-3000:]
    saved = saved.pop()
    assert saved % 20 == 0 and 60 <= saved < 120, saved
    log = (first.run_dir / "logs" / "chief-0.log").read_text()
    assert f"tfrun: preempted: the coordinator saved at step {saved}" in log
    again = launch()
    assert again.run(600) == 0, again.stdout[-3000:]
    log = (again.run_dir / "logs" / "chief-0.log").read_text()
    assert f"tfrun: resuming from the backup of epoch {saved // 20} (the coordinator's)" in log
    assert _final_step(again) == 6 * 20
    assert again.summary["attempts"][-1]["resumed_at_step"] == saved
    assert_nothing_left(again)


def test_seed_001_uai_layout_on_three_local_hosts_runs_to_completion(tmp_path):
    run = Run(tmp_path, ["--layout", "uai", "--hosts", "localhost,localhost,localhost", SCRIPT, "3"])
    assert run.run(300) == 0, run.stdout[-3000:]
    config = json.loads((run.run_dir / "config.json").read_text())
    tf_configs = config["tf_configs"]
    assert sorted(tf_configs) == ["chief:0", "ps:0", "ps:1", "ps:2", "worker:0", "worker:1"]
    assert all(c["environment"] == "cloud" for c in tf_configs.values())
    assert_trained_on_ps(fit_result(run), 3)
    assert_nothing_left(run)


def test_same_script_and_call_under_multi_worker_mirrored(tmp_path):
    """tfrun.fit delegates to model.fit under synchronous strategies: the script is unchanged."""
    run = Run(tmp_path, ["--workers", "2", SCRIPT, "3"])
    assert run.run(300) == 0, run.stdout[-3000:]
    lines = [l for l in run.stdout.splitlines() if "FIT_RESULT" in l]
    assert len(lines) == 2  # every worker runs the script under MWMS
    result = json.loads(lines[0].split("FIT_RESULT ", 1)[1])
    assert result["strategy"] == "CollectiveAllReduceStrategy"
    assert result["loss"][-1] < result["loss"][0]
    assert_nothing_left(run)
