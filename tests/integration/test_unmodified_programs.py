"""Issue 12: plain TensorFlow/Keras programs (tests/scripts/plain/, no tfrun API) run under
tfrun unchanged. Real TensorFlow processes; each test names the item it covers, and where a
compat fix is the cure, the same program with that fix switched off shows the failure."""

import json
import os
import pty
import select
import signal
import sys
import time

import numpy as np
import pytest

from conftest import ROOT, Alone, Run, assert_nothing_left, history_of

pytestmark = pytest.mark.tf
PLAIN = ROOT / "tests" / "scripts" / "plain"


def script(name: str) -> str:
    return str(PLAIN / name)


def logs(run: Run) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run.run_dir / "logs").glob("*.log")))


# --------------------------------------------------------------------------- 12.1


def test_lazily_built_layers_in_a_custom_loop_train_exactly(tmp_path):
    with Alone([sys.executable, script("lazy_loop.py"), "reference",
                str(tmp_path / "ref.npz")]) as reference:
        run = Run(tmp_path, ["--devices", "2", script("lazy_loop.py"), "mirrored",
                             str(tmp_path / "got.npz")])
        assert run.run(300) == 0, run.stdout[-4000:]
        reference.stdout()
    want, got = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "got.npz")
    assert int(got["replicas"]) == 2
    np.testing.assert_allclose(got["losses"], want["losses"], atol=1e-5)
    for i in range(4):
        np.testing.assert_allclose(got[f"arr_{i}"], want[f"arr_{i}"], atol=1e-5)

    without = Run(tmp_path, ["--devices", "2", script("lazy_loop.py"), "mirrored", str(tmp_path / "no.npz")],
                  env={"TFRUN_COMPAT_DISABLE": "layer_build_in_replica_context"}, name="without")
    assert without.run(300) == 1
    assert "You must feed a value for placeholder tensor" in logs(without)


def test_a_metric_whose_result_is_a_variable_trains_as_alone(tmp_path):
    """Issue 48.1: tfrun's fix of keras#20585 (mwms_reduce_logs) reduced every log value
    across workers, and a metric whose result() returns a variable (no device) crashed it:
    "Cannot convert input_tensor to a PerReplica object because it doesn't have device set".
    Stock Keras passes such values through; tfrun reads them on the worker's device."""
    with Alone([sys.executable, script("metric_variable.py")]) as alone:
        run = Run(tmp_path, ["--workers", "2", script("metric_variable.py")])
        assert run.run(300) == 0, run.stdout[-4000:]
        want = history_of(alone.stdout())
    for task in ("worker-0", "worker-1"):
        got = history_of((run.run_dir / "logs" / f"{task}.log").read_text())
        assert got["samples_seen"] == want["samples_seen"] == [64.0, 64.0]
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    assert_nothing_left(run)


def wrote(log: str) -> list[str]:
    line = next(l for l in log.splitlines() if l.startswith("wrote "))
    return [name for name in line[len("wrote "):].split(",") if name]


def test_only_the_chief_writes_a_model_checkpoint_and_a_save_to_one_path(tmp_path):
    """Issue 48.4: ModelCheckpoint("m_{epoch}.keras") and model.save(path) run on both
    workers and wrote one path at once; now only worker:0 writes (the script's audit hook
    lists every .keras file each process opened for writing), worker:1 says so once, and
    the files hold the trained weights. With the fix off, both write again."""
    import keras

    out = tmp_path / "models"
    run = Run(tmp_path, ["--workers", "2", script("checkpoint_every_epoch.py"), str(out)])
    assert run.run(300) == 0, run.stdout[-4000:]
    log = {t: (run.run_dir / "logs" / f"{t}.log").read_text() for t in ("worker-0", "worker-1")}
    assert wrote(log["worker-0"]) == ["final.keras", "m_1.keras", "m_2.keras"]
    assert wrote(log["worker-1"]) == []
    assert log["worker-1"].count("skips model.save") == 1 and "skips" not in log["worker-0"]
    final = keras.models.load_model(out / "final.keras")
    got = np.concatenate([w.ravel() for w in final.get_weights()])
    np.testing.assert_array_equal(got, np.load(out / "weights-1.npy"))
    keras.models.load_model(out / "m_2.keras")

    both = Run(tmp_path, ["--workers", "2", script("checkpoint_every_epoch.py"),
                          str(tmp_path / "both")], env={"TFRUN_COMPAT_DISABLE": "worker_saves"},
               name="both")
    assert both.run(300) == 0, both.stdout[-4000:]
    assert wrote((both.run_dir / "logs" / "worker-1.log").read_text()) \
        == ["final.keras", "m_1.keras", "m_2.keras"]


def test_a_tracker_of_compute_loss_in_an_own_train_step_is_explained_once(tmp_path):
    """Issue 48.5: Keras' compute_loss() divides the loss by the replicas in sync, so a
    tracker of it shows 1/2 under 2 workers (the same training). tfrun says so once, on the
    chief, with the remedy -- and the remedy shows what one process shows."""
    program = script("own_train_step_tracker.py")
    for variant in ("scaled", "unscaled"):
        with Alone([sys.executable, program, variant]) as by_itself:
            run = Run(tmp_path, ["--workers", "2", program, variant], name=variant)
            assert run.run(300) == 0, run.stdout[-4000:]
            alone = by_itself.stdout()
        chief, other = ((run.run_dir / "logs" / f"worker-{i}.log").read_text() for i in (0, 1))
        assert chief.count("Tracked has its own train_step") == 1 and "own train_step" not in other
        want = np.array(history_of(alone)["my_loss"])
        got = np.array(history_of(chief)["my_loss"])
        np.testing.assert_allclose(got, want / 2 if variant == "scaled" else want, rtol=1e-5)


def test_a_model_without_call_trains_in_a_strategy_scope_as_alone(tmp_path):
    """Issue 48.3: a model that only overrides train_step (two sub-models, two optimizers:
    a GAN's or a distiller's shape) failed in any strategy's scope, "Unable to
    automatically build the model" -- one worker or two. Under tfrun it trains, and two
    workers end where one process without a strategy ends."""
    program = script("pair_without_call.py")
    with Alone([sys.executable, program, "alone"]) as alone:  # two single processes side by side
        one = Run(tmp_path, ["--workers", "1", program, "scope"], name="one")
        assert one.run(300) == 0, one.stdout[-4000:]
        want = history_of(alone.stdout())["critic_loss"]
    two = Run(tmp_path, ["--workers", "2", program], name="two")
    assert two.run(300) == 0, two.stdout[-4000:]
    for run, log in ((one, "worker-0"), (two, "worker-0"), (two, "worker-1")):
        got = history_of((run.run_dir / "logs" / f"{log}.log").read_text())["critic_loss"]
        np.testing.assert_allclose(got, want, rtol=1e-5)
    without = Run(tmp_path, ["--workers", "2", program],
                  env={"TFRUN_COMPAT_DISABLE": "model_without_call"}, name="without")
    assert without.run(300) == 1
    assert "Unable to automatically build the model" in logs(without)


# --------------------------------------------------------------------------- 12.2


def test_stock_backup_and_restore_resumes_a_two_worker_run_exactly(tmp_path):
    clean = Run(tmp_path, ["--workers", "2", "--quiet-tasks", script("stock_backup.py"),
                           str(tmp_path / "clean"), str(tmp_path / "backup-clean"), "-1"], name="clean")
    assert clean.run(300) == 0, clean.stdout[-4000:]
    crashed = Run(tmp_path, ["--workers", "2", "--max-restarts", "1", "--quiet-tasks",
                             script("stock_backup.py"), str(tmp_path / "crashed"),
                             str(tmp_path / "backup-crashed"), "1"], name="crashed")
    assert crashed.run(300) == 0, crashed.stdout[-4000:]
    assert crashed.summary["restarts"] == 1
    want = np.load(tmp_path / "clean-worker-0.npz")
    for i in range(2):
        got = np.load(tmp_path / f"crashed-worker-{i}.npz")
        assert list(got["epochs_run"]) == [2, 3]  # resumed after the backed-up epoch 1
        for k in range(4):
            np.testing.assert_array_equal(got[f"arr_{k}"], want[f"arr_{k}"])
    log = logs(crashed)
    assert "resuming from the backup of epoch 2 (complete on every worker)" in log
    # delete_checkpoint=True (Keras' default): nothing left of either backup directory.
    assert not (tmp_path / "backup-clean").exists() and not (tmp_path / "backup-crashed").exists()
    assert_nothing_left(crashed)


# --------------------------------------------------------------------------- 12.3


def test_plain_model_fit_and_evaluate_under_parameter_server_strategy(tmp_path):
    run = Run(tmp_path, ["--chief", "--workers", "2", "--ps", "1", script("ps_fit.py")])
    assert run.run(300) == 0, run.stdout[-4000:]
    line = next(l for l in run.stdout.splitlines() if "PS_FIT " in l)
    assert line.startswith("[chief:0]")
    result = json.loads(line.split("PS_FIT ", 1)[1])
    losses = result["history"]["loss"]
    assert len(losses) == 4 and losses[-1] < losses[0]
    assert len(result["history"]["val_loss"]) == 4
    assert result["evaluate"]["accuracy"] > 0.8
    # Arguments with no meaning under PS: a clear error that names them and tfrun.fit.
    assert result["misuse"].startswith("ConfigError: model.fit under ParameterServerStrategy does "
                                       "not take y, batch_size"), result["misuse"]
    assert "tfrun.fit" in result["misuse"]
    tasks = run.tasks()
    assert tasks["ps:0"]["stopped_by_tfrun"] and tasks["chief:0"]["state"] == "succeeded"
    # Issue 13.1: the coordinator's epochs are recorded (no batch hooks under PS).
    epochs = [json.loads(l) for l in (run.run_dir / "metrics" / "chief-0.jsonl").read_text().splitlines()]
    epochs = [r for r in epochs if r["event"] == "epoch"]
    assert [r["epoch"] for r in epochs] == [1, 2, 3, 4]
    assert [r["logs"]["loss"] for r in epochs] == pytest.approx(losses)
    assert all("val_loss" in r["logs"] and r["steps_per_s"] > 0 for r in epochs)


# --------------------------------------------------------------------------- 12.5


def test_tf_keras_loads_h5_weights_under_mirrored_strategy(tmp_path):
    args = ["--keras", "2", "--devices", "2", script("tf_keras_h5.py")]
    run = Run(tmp_path, [*args, str(tmp_path / "a.weights.h5")])
    assert run.run(300) == 0, run.stdout[-4000:]
    assert "tf_keras_h5: keras 2." in run.stdout and "2 replicas, weights restored: True" in run.stdout
    without = Run(tmp_path, [*args, str(tmp_path / "b.weights.h5")],
                  env={"TFRUN_COMPAT_DISABLE": "h5_load_under_strategy"}, name="without")
    assert without.run(300) == 1
    assert "unsupported operand type(s) for /: 'Dataset' and 'int'" in logs(without)


# --------------------------------------------------------------------------- 12.6 + 12.9


def run_on_a_terminal(args: list[str], run_dir, timeout: float = 300) -> bytes:
    """tfrun with its stdout on a pseudo-terminal (as a user sees it); all it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: tfrun
        os.chdir(ROOT)
        env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
        os.execvpe(sys.executable, [sys.executable, "-m", "tfrun", "--run-dir", str(run_dir),
                                    "--color", "never", *args], env)
    out, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the terminal's other side closed
            break
        if not data:
            break
        out += data
    else:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out.decode(errors="replace")[-4000:]
    return out


def test_keras_progress_bars_are_live_and_prefixed_and_continuations_are_hidden(tmp_path):
    out = run_on_a_terminal(["--workers", "2", script("progress_fit.py")], tmp_path / "run").decode()
    first_epoch = out[:out.index("Epoch 2/2")]
    # Updates of the bar arrive while epoch 1 runs, each redrawn in place with its task prefix.
    # (Each redraw is "\r<erase line>[task] text"; it lasts until the next "\r".)
    updates = [u.split("\r")[0] for u in first_epoch.split("\r\x1b[K")[1:]]
    updates = [u for u in updates if "/128" in u]
    assert len(updates) >= 4, first_epoch[-3000:]
    assert "\b" not in "".join(updates), updates
    # Issue 13.2: one progress stream, worker 0's: worker 1 prints the same bar, in its log only.
    assert all(u.startswith("[worker:0]") for u in updates), updates
    # The epoch's last line stays, prefixed (the bar is not left half-drawn over the prefix).
    lines = out.replace("\r\n", "\n").split("\n")
    final = [l.split("\r\x1b[K")[-1] for l in lines if "128/128" in l]
    assert final and all(f.startswith("[worker:0]") for f in final), final
    epochs = [l.split("\r\x1b[K")[-1] for l in lines if "Epoch " in l and "/2" in l]
    assert sorted(set(epochs)) == ["[worker:0] Epoch 1/2", "[worker:0] Epoch 2/2"], epochs
    # ... and a status line under it, redrawn about once a second.
    status = [s for s in out.split("\r\x1b[K") if s.startswith("tfrun: ") and "tasks up" in s]
    assert status and any(s.startswith("tfrun: 2/2 tasks up") for s in status), out[-3000:]
    # Redrawn as soon as an epoch ends, too: epochs here take a fraction of a second, and
    # two may end within one 0.1 s poll, so either may be the one shown.
    assert any(("epoch 1/2 done" in s or "epoch 2/2 done" in s) and "steps/s" in s
               for s in status), status
    # The log files keep the tasks' bytes as written, worker 1's bar included.
    logged = b"".join(p.read_bytes() for p in (tmp_path / "run" / "logs").glob("*.log"))
    assert b"\r" in logged and b"\x08" in logged
    assert b"128/128" in (tmp_path / "run" / "logs" / "worker-1.log").read_bytes()
    # Both workers' epochs are in the run dir.
    for worker in (0, 1):
        recorded = (tmp_path / "run" / "metrics" / f"worker-{worker}.jsonl").read_text().splitlines()
        records = [json.loads(r) for r in recorded]
        assert [r["epoch"] for r in records if r["event"] == "epoch"] == [1, 2], records
    # 12.9: a continuation of TensorFlow's "Example stragglers:" log line (worker:0 waiting
    # for worker:1; whether it waits is up to timing) is in the log but not on the console.
    straggler = [l for l in lines if "/job:worker/replica:0/task:" in l and "]" in l[:12]]
    assert not straggler, straggler
    if b"Example stragglers:\n/job:worker/replica:0/task:1\n" not in logged:
        print("note: worker:0 never waited for worker:1 this time")


def test_without_a_terminal_one_progress_stream_and_show_all_gives_both(tmp_path):
    """13.2: piped output (no TTY): no status line, plain lines; worker 1's "Epoch" and step
    lines only with --show all."""
    default = Run(tmp_path, ["--workers", "2", script("progress_fit.py")], name="default")
    assert default.run(300) == 0, default.stdout[-4000:]
    shown = Run(tmp_path, ["--show", "all", "--workers", "2", script("progress_fit.py")], name="all")
    assert shown.run(300) == 0, shown.stdout[-4000:]
    for run, tasks in ((default, {"worker:0"}), (shown, {"worker:0", "worker:1"})):
        ends = {l.split("]")[0][1:] for l in run.stdout.splitlines() if "128/128" in l}
        starts = {l.split("]")[0][1:] for l in run.stdout.splitlines() if l.endswith("Epoch 1/2")}
        assert ends == tasks and starts == tasks, run.stdout[-3000:]
    assert "tasks up" not in default.stdout and "\x1b" not in default.stdout


# --------------------------------------------------------------------------- 12.7


def test_failure_summary_keeps_tensorflows_error_message(tmp_path):
    run = Run(tmp_path, [script("end_of_data.py")])
    assert run.run(300) == 1
    traceback = run.summary["root_cause"]["traceback"]
    assert "OutOfRangeError: Graph execution error:" in traceback
    assert "End of sequence" in traceback and "[[{{node IteratorGetNext}}]]" in traceback
    assert "end_of_data.py" in traceback
    console = run.stdout[run.stdout.index("last traceback"):]
    assert "End of sequence" in console


# --------------------------------------------------------------------------- 12.8


def test_ctrl_c_during_collectives_stops_both_workers_by_sigterm_at_once(tmp_path):
    # A grace far beyond the test's patience: a task that ignored SIGTERM inside a
    # collective would only die by SIGKILL after 600 s.
    run = Run(tmp_path, ["--workers", "2", "--stop-grace", "600", script("long_fit.py")]).start()
    seen, deadline = set(), time.monotonic() + 240
    for line in run.proc.stdout:
        if "long_fit: step 500" in line:
            seen.add(line.split("]")[0])
        if len(seen) == 2 or time.monotonic() > deadline:
            break
    assert len(seen) == 2, "the workers never trained"
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 128 + signal.SIGINT, run.stdout
    tasks = run.tasks()
    assert {t: (tasks[t]["state"], tasks[t]["signal"]) for t in tasks} == {
        "worker:0": ("stopped", "SIGTERM"), "worker:1": ("stopped", "SIGTERM")}, run.stdout
    assert "SIGKILL" not in run.stdout
    assert_nothing_left(run)


# --------------------------------------------------------------------------- 12.9


@pytest.mark.parametrize("lingering", [0, 1], ids=["worker0-lingers", "leader-leaves-first"])
def test_a_peer_that_exits_cleanly_first_is_no_crash_on_the_console(tmp_path, lingering):
    # TF's alarm comes ~10 s (heartbeat timeout) after a peer left, ~4 s after the leader did.
    run = Run(tmp_path, ["--workers", "2", script("late_exit.py"), str(lingering), "16"])
    assert run.run(300) == 0, run.stdout[-3000:]
    alarm = ("tasks have crashed" if lingering == 0
             else "Failed to send RPC to coordination service")
    # The situation really happened: the lingering worker's log has TF's alarm ...
    assert alarm in (run.run_dir / "logs" / f"worker-{lingering}.log").read_text()
    # ... and the console, of a run where every task succeeded, does not.
    assert "StartAbort" not in run.stdout and alarm not in run.stdout, run.stdout[-3000:]
    assert "/job:worker/replica:0/task:" not in run.stdout
    assert f"[worker:{lingering}] late_exit: worker {lingering} done" in run.stdout


# --------------------------------------------------------------------------- 12.10


def test_a_script_that_replaces_devices_gets_a_warning(tmp_path):
    run = Run(tmp_path, ["--devices", "2", script("own_devices.py")])
    assert run.run(300) == 0, run.stdout[-3000:]
    assert "own_devices: 3 replicas" in run.stdout
    assert ("tfrun: the script configures 3 logical CPU device(s) itself, replacing tfrun "
            "--devices 2: this task runs with 3") in run.stdout
    # The banner can only say what tfrun asked for; the summary says what the task ran with.
    assert "devices    : 2 logical CPU device(s) per task" in run.stdout
    assert "ran with 3 logical CPU device(s): its script replaced --devices" in run.stdout
    [task] = json.loads((run.run_dir / "summary.json").read_text())["tasks"]
    assert task["devices_in_use"] == 3
    quiet = Run(tmp_path, ["--devices", "3", script("own_devices.py")], name="same")
    assert quiet.run(300) == 0 and "replacing tfrun --devices" not in quiet.stdout
    assert "its script replaced --devices" not in quiet.stdout
    [task] = json.loads((quiet.run_dir / "summary.json").read_text())["tasks"]
    assert task["devices_in_use"] is None
