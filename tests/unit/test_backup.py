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


def test_every_guarded_keras_internal_exists_on_the_pinned_versions():
    names = [i.spelled for i in internals.INTERNALS]
    assert len(names) == len(set(names)) >= 10
    for flavour in ("keras", "tf_keras"):
        assert internals.missing(flavour) == [], flavour
        assert internals.exact_resume_problem(flavour) is None
        assert internals.untested_version(flavour) is None  # the pins are the tested versions


def test_a_missing_internal_turns_exact_resume_off_and_says_so(monkeypatch):
    bogus = internals.Internal("keras", "keras.src.trainers.epoch_iterator", "EpochIterator",
                               "_renamed_in_a_later_keras", "batches read", in_source=True)
    monkeypatch.setattr(internals, "INTERNALS", internals.INTERNALS + (bogus,))
    monkeypatch.setattr(internals, "_checked", {})
    problem = internals.exact_resume_problem("keras")
    assert problem is not None and "EpochIterator._renamed_in_a_later_keras" in problem
    assert "resume at the start of the epoch" in problem
    assert internals.exact_resume_problem("tf_keras") is None


def _model(keras, units: int = 4):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(units)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


@pytest.mark.parametrize("legacy", [False, True], ids=["keras3", "tf_keras"])
def test_a_restore_whose_optimizer_step_differs_from_its_mark_is_refused(tmp_path, legacy):
    import numpy as np

    if legacy:
        import tf_keras as keras
    else:
        import keras
    from tfrun.in_task.backup.store import BackupStore, RestoreMismatch, complete_saves

    model = _model(keras)
    x, y = np.ones((8, 3), "float32"), np.zeros((8, 4), "float32")
    model.fit(x, y, epochs=1, batch_size=4, verbose=0)  # 2 steps
    store = BackupStore(str(tmp_path / "worker-0"), legacy=legacy)
    store.write(model, "step-2", {"epoch": 0, "batch": 2, "step": 2, "input": None,
                                  "replicas": 1})
    store.write(model, "step-9", {"epoch": 0, "batch": 9, "step": 9, "input": None,
                                  "replicas": 1})  # a mark that lies about its step
    assert not [n for n in os.listdir(store.directory) if ".tmp" in n]
    good, bad = complete_saves(store.directory)
    fresh = _model(keras)
    fresh.optimizer.build(fresh.trainable_variables)
    store.load(fresh, good)
    assert int(fresh.optimizer.iterations.numpy()) == 2
    np.testing.assert_array_equal(fresh.get_weights()[0], model.get_weights()[0])
    with pytest.raises(RestoreMismatch, match=r"taken at step 9, but the optimizer's step "
                                              r"after loading it is 2.*Received: step 2"):
        store.load(_built(keras), bad)


def _built(keras):
    model = _model(keras)
    model.optimizer.build(model.trainable_variables)
    return model


def test_a_tf_keras_checkpoint_of_another_model_is_refused(tmp_path):
    import tf_keras

    from tfrun.in_task.backup.store import BackupStore, RestoreMismatch, complete_saves

    store = BackupStore(str(tmp_path / "worker-0"), legacy=True)
    store.write(_built(tf_keras), "epoch-1", {"epoch": 1, "batch": 0, "step": 0,
                                              "input": None, "replicas": 1})
    other = tf_keras.Sequential([tf_keras.Input((3,)), tf_keras.layers.Dense(4),
                                 tf_keras.layers.Dense(2)])
    other.compile(optimizer=tf_keras.optimizers.Adam(0.01), loss="mse")
    other.optimizer.build(other.trainable_variables)
    with pytest.raises(RestoreMismatch, match=r"does not match this model"):
        store.load(other, complete_saves(store.directory)[0])
