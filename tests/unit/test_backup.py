"""The backup's parts on their own: the preemption watch's clocks (a real process and a real
SIGTERM, no TensorFlow), the guarded Keras internals, and the restore check (a real Keras
model, in this process)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfrun import contract
from tfrun.in_task.compat import internals


def _watched(tmp_path, body: str, *, grace: float) -> tuple[subprocess.CompletedProcess, float]:
    """Run ``body`` after a PreemptionWatch (grace ``grace``) listens and one 0.05 s step
    was measured; SIGTERM arrives when the body prints "ready". Returns the process and the
    seconds from the SIGTERM to its end."""
    script = textwrap.dedent("""
        import time
        from tfrun.in_task.preemption import PreemptionWatch
        watch = PreemptionWatch(grace=GRACE)
        watch.listen()
        watch.step_began(); time.sleep(0.05); watch.step_ended(12)
    """).replace("GRACE", repr(grace)) + textwrap.dedent(body)
    env = {**os.environ, contract.RUN_DIR: str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", line + proc.communicate()[0]
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    out, _ = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out), time.monotonic() - sent


def _stopped_event(out: str) -> dict:
    records = [json.loads(line[len(contract.METRICS_LINE):]) for line in out.splitlines()
               if line.startswith(contract.METRICS_LINE)]
    stopped = [r for r in records if r.get("event") == contract.STOPPED_EVENT]
    assert len(stopped) == 1, out
    return stopped[0]


def test_a_long_backup_after_the_notice_is_never_taken_for_a_stall(tmp_path):
    """The 210M-parameter case: a backup taking far longer than the stall limit (2 s here)
    completes; only a step that then runs on is stalled."""
    done, seconds = _watched(tmp_path, """
        print("ready", flush=True)
        time.sleep(0.3)  # the notice is seen
        with watch.busy("the backup"):
            time.sleep(4.0)
        print("backup finished", flush=True)
        watch.step_began()
        time.sleep(30)  # a step stuck on a lost peer
        print("never", flush=True)
    """, grace=60.0)
    assert done.returncode == -signal.SIGTERM, done.stdout
    assert "backup finished" in done.stdout and "never" not in done.stdout
    assert "a training step has run for" in done.stdout and "a peer is gone" in done.stdout
    assert 6.0 <= seconds < 20, seconds
    event = _stopped_event(done.stdout)
    assert (event["reason"], event["doing"], event["step"]) == ("stalled", "a training step", 12)


def test_a_backup_that_outlasts_the_grace_is_stopped_and_named(tmp_path):
    done, seconds = _watched(tmp_path, """
        print("ready", flush=True)
        with watch.busy("the backup"):
            time.sleep(30)
        print("never", flush=True)
    """, grace=3.0)
    assert done.returncode == -signal.SIGTERM, done.stdout
    assert "the agreed backup did not finish within the 3s grace (--preemption-grace), " \
           "while the backup" in done.stdout
    assert 2.0 <= seconds < 15, seconds  # the grace less its margin (0.3 s)
    assert _stopped_event(done.stdout)["reason"] == "grace"


def test_a_collective_with_peers_counts_as_running():
    from tfrun.in_task.preemption import PreemptionWatch

    watch = PreemptionWatch(grace=30.0)
    with watch.busy("the agreement on a stop", with_peers=True):
        assert watch._running_since is not None and watch.doing == "the agreement on a stop"
    with watch.busy("the backup"):
        assert watch._running_since is None
    assert watch.doing == "callbacks"


def test_agreement_checks_keep_coming_when_epochs_end_slowly():
    """Steps of 10 ms, but each 4-step epoch ends with 0.5 s of callbacks (the k8s eviction
    test's shape): the checks' spacing follows the real wall time, so a notice at step 8 is
    agreed on long before the 40th and last step (an interval measured over two fast steps
    once spaced the next check 100 steps on)."""
    from tfrun.in_task.preemption import FIRST_CHECK, next_interval

    def wall_time(step):  # seconds at the end of ``step``
        return step * 0.01 + (step // 4) * 0.5

    checks, interval, last = [], FIRST_CHECK, 0
    step = FIRST_CHECK
    while step <= 40:
        checks.append(step)
        mean = (wall_time(step) - wall_time(last)) / (step - last)
        interval, last = next_interval(interval, mean), step
        step += interval
    assert checks[:3] == [1, 3, 7]  # intervals 2, 4: at most doubling
    gaps = [wall_time(b) - wall_time(a) for a, b in zip(checks, checks[1:])]
    assert max(gaps) < 2.5, checks
    assert any(8 < c <= 20 for c in checks), checks


def test_a_missing_tensorflow_internal_leaves_the_all_reduce_to_tensorflow(monkeypatch, capsys):
    """On a TensorFlow without a name the exchange's hook reads, the hook is not put in:
    the task says why once and its all-reduces stay TensorFlow's (never an AttributeError
    inside a traced step)."""
    from types import SimpleNamespace

    from tfrun.in_task.exchange import allreduce

    bogus = internals.Internal("tensorflow", "tfrun.in_task.exchange.allreduce", None,
                               "_renamed_in_a_later_tensorflow", "the launcher's group",
                               feature=internals.EXCHANGE)
    monkeypatch.setattr(internals, "INTERNALS", (bogus,))
    monkeypatch.setattr(internals, "_features_checked", {})

    class CollectiveReplicaLauncher:
        def all_reduce(self):
            return "TensorFlow's"

    allreduce._hook(SimpleNamespace(CollectiveReplicaLauncher=CollectiveReplicaLauncher),
                    plan=None)
    assert CollectiveReplicaLauncher().all_reduce() == "TensorFlow's"
    said = capsys.readouterr().err
    assert "lacks tfrun.in_task.exchange.allreduce._renamed_in_a_later_tensorflow" in said, said
    assert "tfrun's exchange needs: this task's all-reduces go through TensorFlow's" in said


def test_a_missing_internal_turns_exact_resume_off_and_says_so(monkeypatch):
    bogus = internals.Internal("keras", "keras.src.trainers.epoch_iterator", "EpochIterator",
                               "_renamed_in_a_later_keras", "batches read", in_source=True)
    monkeypatch.setattr(internals, "INTERNALS", internals.INTERNALS + (bogus,))
    monkeypatch.setattr(internals, "_features_checked", {})
    problem = internals.exact_resume_problem("keras")
    assert problem is not None and "EpochIterator._renamed_in_a_later_keras" in problem
    assert "resume at the start of the epoch" in problem
    assert internals.exact_resume_problem("tf_keras") is None


def _model(keras, units: int = 4):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def _keras(legacy: bool):
    if legacy:
        import tf_keras

        return tf_keras
    import keras

    return keras


@pytest.mark.parametrize("background", [True, False], ids=["background", "sync"])
@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_restore_whose_optimizer_step_differs_from_its_mark_is_refused(tmp_path, legacy,
                                                                          background):
    import numpy as np

    from tfrun.in_task.backup.store import BackupStore, RestoreMismatch, complete_saves

    keras = _keras(legacy)
    model = _model(keras)
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 4), "float32")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)  # 2 steps
    store = BackupStore(str(tmp_path / "worker-0"), background=background)
    store.write(model, "step-2", {"epoch": 0, "batch": 2, "step": 2, "input": None,
                                  "replicas": 1})
    trained = [np.array(w) for w in model.get_weights()]
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)  # trains on while it is written
    store.write(model, "step-9", {"epoch": 0, "batch": 9, "step": 9, "input": None,
                                  "replicas": 1})  # a mark that lies about its step
    store.wait()
    assert not [n for n in os.listdir(store.directory) if ".tmp" in n]
    good, bad = complete_saves(store.directory)
    fresh = _built(keras)
    store.load(fresh, good)
    assert int(fresh.optimizer.iterations.numpy()) == 2
    for got, want in zip(fresh.get_weights(), trained):  # the state when it was taken
        np.testing.assert_array_equal(got, want)
    with pytest.raises(RestoreMismatch, match=r"taken at step 9, but the optimizer's step "
                                              r"after loading it is 4.*Received: step 4"):
        store.load(_built(keras), bad)


def _built(keras):
    model = _model(keras)
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_backup_of_another_model_is_refused(tmp_path, legacy):
    from tfrun.in_task.backup.store import BackupStore, RestoreMismatch, complete_saves

    keras = _keras(legacy)
    store = BackupStore(str(tmp_path / "worker-0"))
    store.write(_built(keras), "epoch-1", {"epoch": 1, "batch": 0, "step": 0,
                                           "input": None, "replicas": 1})
    store.wait()
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5)])
    other.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    other.optimizer.build(other.trainable_variables)
    with pytest.raises(RestoreMismatch, match=r"does not match this model: .* is \(3, 4\) "
                                              r"float32, this model's .* is \(3, 5\) float32"):
        store.load(other, complete_saves(store.directory)[0])


def test_a_failed_background_write_is_reported_and_leaves_no_mark(tmp_path, capsys,
                                                                    monkeypatch):
    import keras

    from tfrun.in_task.backup.store import BackupStore, complete_saves

    monkeypatch.setenv(contract.RUN_DIR, str(tmp_path))  # training events are recorded
    directory = tmp_path / "worker-0"
    directory.mkdir()
    # A file where the writer makes its temporary directory: the write fails in the
    # background thread (an OSError, as the disk's own errors), and the next wait (the
    # next backup, a stop, the end) says so, without ending training.
    (directory / "step-1.state.tmp").write_text("in the way")
    store = BackupStore(str(directory))
    store.write(_built(keras), "step-1", {"epoch": 0, "batch": 1, "step": 0, "input": None,
                                          "replicas": 1})
    assert store.wait() is False
    out = capsys.readouterr().out
    assert "tfrun: backup step-1 not written: File exists" in out, out
    assert "Training goes on; there is no older backup yet" in out
    event = json.loads(out.split(contract.METRICS_LINE)[1].splitlines()[0])
    assert event["event"] == contract.BACKUP_NOT_WRITTEN_EVENT and event["backup"] == "step-1"
    assert complete_saves(str(directory)) == [] and not (directory / "step-1.json").exists()
    assert store.wait() is True  # reported once
    store.remove_temporaries()  # what a task killed mid-write leaves, removed at the next start
    assert os.listdir(directory) == []


def _written_and_loaded(tmp_path, keras, name: str):
    """Take the state of a built model (weights set to known values), write it, load it into
    a fresh model; returns (state, the loaded model's weights, what was written)."""
    import numpy as np

    from tfrun.in_task.backup import snapshot

    model = _built(keras)
    want = [np.full(w.shape, i + 0.5, w.dtype) for i, w in enumerate(model.get_weights())]
    model.set_weights(want)
    state = snapshot.take(model)
    snapshot.write_now(state, str(tmp_path / name))
    fresh = _built(keras)
    snapshot.load(fresh, str(tmp_path / name))
    return state, fresh.get_weights(), want


def test_a_state_is_one_aligned_buffer_written_whole_and_reused(tmp_path):
    """The state's arrays are views into one page-aligned mapping, each at a 64-byte
    offset; the file holds whole 4 KB blocks; a second take of the same model reuses the
    buffer, another model's gets its own."""
    import keras
    import numpy as np

    from tfrun.in_task.backup import snapshot

    state, got, want = _written_and_loaded(tmp_path, keras, "a.state")
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert all(offset % 64 == 0 for offset in state.offsets)
    assert all(v.ctypes.data % 64 == 0 for v in state.values)
    assert len(state.buffer) % 4096 == 0 and len(state.buffer) >= state.size
    index = json.loads((tmp_path / "a.state" / "variables.json").read_text())
    assert [e["offset"] for e in index["variables"]] == state.offsets
    assert index["bytes"] == state.size
    assert os.path.getsize(tmp_path / "a.state" / "values.bin") in (state.size, len(state.buffer))
    again = snapshot.take(_built(keras), into=state)
    assert again.buffer is state.buffer
    other = keras.Sequential([keras.Input((3,)), keras.layers.Dense(5)])
    other.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    other.optimizer.build(other.trainable_variables)
    assert snapshot.take(other, into=state).buffer is not state.buffer


@pytest.mark.parametrize("refused_at", ["open", "write"])
def test_a_filesystem_without_direct_io_gets_buffered_writes(tmp_path, monkeypatch, refused_at):
    """tmpfs before Linux 6.6 refuses O_DIRECT at open; some filesystems only at the first
    write (EINVAL): the state is then written buffered, whole."""
    import errno

    import keras
    import numpy as np

    if not getattr(os, "O_DIRECT", 0):
        pytest.skip("no O_DIRECT on this platform")
    real_open, real_pwrite = os.open, os.pwrite
    direct_fds: set[int] = set()
    refused = []

    def open_(path, flags, *args):
        if flags & os.O_DIRECT and refused_at == "open":
            refused.append(path)
            raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *args)
        if flags & os.O_DIRECT:
            direct_fds.add(fd)
        return fd

    def pwrite(fd, data, offset):
        if fd in direct_fds:
            direct_fds.discard(fd)  # closed by the writer: its number may be reused
            refused.append(fd)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "pwrite", pwrite)
    state, got, want = _written_and_loaded(tmp_path, keras, "b.state")
    assert refused, "the direct path was never tried"
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert os.path.getsize(tmp_path / "b.state" / "values.bin") == state.size


def test_a_resume_waits_for_the_write_an_earlier_fit_left_in_flight(monkeypatch, tmp_path):
    """A fit that raised may leave its last backup being written; a fit resuming in the
    same process first waits for it (else which backup it resumes from is a race with the
    disk: seen under load, test_the_input_is_put_back_where_it_was_in_every_epoch_form)."""
    from tfrun.in_task.backup import snapshot

    done = []

    def slow_write(state, final):
        time.sleep(0.3)
        done.append(final)
        return {}

    monkeypatch.setattr(snapshot, "write_now", slow_write)
    snapshot.Writer().write(object(), str(tmp_path / "a"), lambda files: done.append("mark"))
    assert done == []  # in flight
    snapshot.finish_writes_in_flight()
    assert done == [str(tmp_path / "a"), "mark"]
    snapshot.finish_writes_in_flight()  # nothing in flight: returns at once


def test_a_fit_resuming_after_one_that_raised_finds_the_backup_it_was_writing(
        monkeypatch, tmp_path, capsys):
    """The second fit's start must not clear the first one's write in flight as a killed
    task's leftover: it waits for it first, then resumes from it. (Under load, the run's
    newest ``.state.tmp`` was removed under its writer and the resume went back one backup
    -- exact, but not from the newest: test_the_input_is_put_back_where_it_was_in_every_
    epoch_form, two tests at a time.) Keras 3 in this process; the code is both flavours'."""
    import numpy as np

    import tfrun
    from tfrun.in_task.backup import snapshot

    real_fsync_path = snapshot.fsync_path

    def slow_on_the_temporary(path):  # mid-write: the .tmp directory exists, unrenamed
        if path.endswith(".tmp"):
            time.sleep(0.5)
        real_fsync_path(path)

    monkeypatch.setattr(snapshot, "fsync_path", slow_on_the_temporary)
    monkeypatch.setenv(contract.BACKUP_WRITE, "background")
    keras = _keras(False)
    x, y = np.ones((16, 3), "float32"), np.zeros((16, 4), "float32")

    class Stop(Exception):
        pass

    class StopAt(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations.numpy()) == 6:
                raise Stop()

    def fit(*extra):
        backup = tfrun.backup_and_restore(str(tmp_path / "backups"), save_freq=2,
                                          preemption_check=0)
        _model(keras).fit(x, y, epochs=3, batch_size=4, verbose=0, callbacks=[backup, *extra])

    with pytest.raises(Stop):
        fit(StopAt())  # raises right after step 6's backup started its write
    capsys.readouterr()
    fit()
    said = capsys.readouterr().out
    assert "after its batch 2 (global step 6)" in said, said


def test_an_agreed_preemption_stop_runs_finally_blocks_but_not_atexit_handlers():
    """stop_preempted: exit 143 once the script unwound (its ``finally`` ran), at the first
    exit handler, so the handlers registered before it (a tracker's) do not run -- as
    docs/fault-tolerance.md says."""
    program = textwrap.dedent("""
        import atexit
        from tfrun.in_task.preemption import stop_preempted
        atexit.register(lambda: print("atexit ran", flush=True))
        try:
            stop_preempted("every worker", 30, "epoch 2, batch 10", epoch=2, batch=10)
        finally:
            print("finally ran", flush=True)
        print("went on", flush=True)
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFRUN_")}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env=env, timeout=60)
    assert done.returncode == 143, done.stderr
    lines = done.stdout.splitlines()
    assert lines == ["tfrun: preempted: every worker saved at step 30 (epoch 2, batch 10); "
                     "stopping", "finally ran"], done.stdout
