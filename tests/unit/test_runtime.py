"""Runtime helpers that read only the environment (no TensorFlow needed)."""

import json
import os

import re
import signal
import subprocess
import sys
import textwrap

import pytest

from tfrun.in_task import runtime
from tfrun.errors import ConfigError


def tf_config(cluster, role, index):
    return json.dumps({"cluster": cluster, "task": {"type": role, "index": index}})


@pytest.fixture
def env(monkeypatch):
    for key in ("TF_CONFIG", "TFRUN_STRATEGY", "TFRUN_RUN_DIR", "TFRUN_OUTPUT_DIR",
                "TFRUN_SCRATCH_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(runtime, "_private_dirs", [])
    return monkeypatch


def test_no_cluster_is_a_chief_worker_with_a_local_strategy(env):
    info = runtime.task()
    assert (info.role, info.index, info.num_workers, info.in_cluster) == ("worker", 0, 1, False)
    assert runtime.is_chief()
    assert runtime.strategy_kind() == "local"


@pytest.mark.parametrize("cluster, role, index, chief, kind", [
    ({"worker": ["a:1", "b:1"]}, "worker", 0, True, "multiworker"),
    ({"worker": ["a:1", "b:1"]}, "worker", 1, False, "multiworker"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "chief", 0, True, "multiworker"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "worker", 0, False, "multiworker"),
    ({"master": ["c:1"], "worker": ["a:1"]}, "master", 0, True, "multiworker"),
    ({"chief": ["c:1"], "worker": ["a:1"], "ps": ["p:1"]}, "chief", 0, True, "ps"),
    ({"chief": ["c:1"], "worker": ["a:1"], "ps": ["p:1"]}, "ps", 0, False, "ps"),
    ({"chief": ["c:1"], "worker": ["a:1"]}, "evaluator", 0, False, "local"),
])
def test_roles_and_auto_strategy_from_tf_config(env, cluster, role, index, chief, kind):
    env.setenv("TF_CONFIG", tf_config(cluster, role, index))
    assert runtime.is_chief() is chief
    assert runtime.strategy_kind() == kind
    assert runtime.task().role == ("chief" if role == "master" else role)


def test_strategy_override_and_bad_value(env):
    env.setenv("TFRUN_STRATEGY", "central")
    assert runtime.strategy_kind() == "central"
    assert runtime.strategy_kind("mirrored") == "mirrored"
    with pytest.raises(ConfigError, match="Unknown strategy 'magic'"):
        runtime.strategy_kind("magic")


def test_output_dir_is_shared_for_the_chief_and_private_for_others(env, tmp_path):
    env.setenv("TFRUN_RUN_DIR", str(tmp_path))
    env.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:1"]}, "worker", 0))
    assert runtime.output_dir("ckpt") == str(tmp_path / "output" / "ckpt")
    env.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:1"]}, "worker", 1))
    private = runtime.output_dir("ckpt")
    assert not private.startswith(str(tmp_path)) and os.path.isdir(private)
    assert "tfrun-worker-1-" in private


def test_a_non_chief_output_dir_lives_in_the_scratch_dir_tfrun_gives_the_task(env, tmp_path):
    # Under tfrun the launcher's backend owns (and removes) the task's scratch directory,
    # so a killed task leaves no temp dir behind (see test_stopping.py).
    env.setenv("TFRUN_SCRATCH_DIR", str(tmp_path / "scratch"))
    env.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:1"]}, "worker", 1))
    assert runtime.output_dir("ckpt") == str(tmp_path / "scratch" / "output" / "ckpt")
    assert (tmp_path / "scratch" / "output" / "ckpt").is_dir()


def test_a_file_name_in_the_output_dir_is_a_path_to_write_not_a_directory(env, tmp_path):
    """The docs' first save line, ``tfrun.save(model, tfrun.output_dir("model.keras"))``,
    once made ``model.keras`` a directory and the save failed with IsADirectoryError: a
    name that ends like a file is the file's path, its directory made; others stay
    directories."""
    env.setenv("TFRUN_RUN_DIR", str(tmp_path))
    env.setenv("TFRUN_SCRATCH_DIR", str(tmp_path / "scratch"))
    for index, base in ((0, tmp_path / "output"), (1, tmp_path / "scratch" / "output")):
        env.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:1"]}, "worker", index))
        path = runtime.output_dir("model.keras")
        assert path == str(base / "model.keras") and not os.path.exists(path), path
        assert base.is_dir()
        nested = runtime.output_dir("exports/weights.weights.h5")
        assert not os.path.exists(nested) and (base / "exports").is_dir()
        assert os.path.isdir(runtime.output_dir("saved_model"))
        assert os.path.isdir(runtime.output_dir("run.v2"))  # no file type: a directory


def test_training_done_marker(env, tmp_path):
    assert not runtime.training_done()
    env.setenv("TFRUN_RUN_DIR", str(tmp_path))
    assert not runtime.training_done()
    (tmp_path / ".tfrun").mkdir()
    (tmp_path / ".tfrun" / "training_done").write_text("1")
    assert runtime.training_done()


def test_global_batch_size_rejects_nonsense(env):
    with pytest.raises(ConfigError, match="at least 1"):
        runtime.global_batch_size(0)


def test_keep_global_batch_scales_by_the_workers_the_run_started_with(env):
    """--keep-global-batch (issue 33): 3 workers at the start, 2 after a re-form: the
    global batch stays 3 x 64 (each of the 2 replicas reads 96); without it, 2 x 64.
    (The strategy is a stand-in with 2 replicas: a real one would need the cluster.)"""
    class TwoReplicas:
        num_replicas_in_sync = 2

    env.setattr(runtime, "strategy", lambda: TwoReplicas())
    env.delenv("TFRUN_BATCH_REPLICAS", raising=False)
    env.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:1"]}, "worker", 0))
    assert runtime.global_batch_size(64) == 128
    env.setenv("TFRUN_BATCH_WORKERS", "3")
    assert runtime.global_batch_size(64) == 192
    env.setenv("TF_CONFIG", tf_config({"worker": ["a:1", "b:1", "c:1"]}, "worker", 0))
    env.setattr(TwoReplicas, "num_replicas_in_sync", 3)
    assert runtime.global_batch_size(64) == 192  # before any re-form: unchanged


@pytest.mark.parametrize("save_freq", ["batch", 0, -5, 2.5, True])
def test_backup_and_restore_refuses_a_save_freq_that_is_not_steps(save_freq):
    import tfrun

    with pytest.raises(ValueError, match=rf"expected 'epoch' or a number of steps >= 1.*"
                                         rf"Received: save_freq={re.escape(repr(save_freq))}"):
        tfrun.backup_and_restore(save_freq=save_freq)


def test_backup_and_restore_takes_step_backups_in_both_keras_flavours(monkeypatch, tmp_path):
    """save_freq=N gives the consistent backup in both flavours (each resumed exactly: the
    integration tests); outside a cluster, epoch backups stay Keras' own BackupAndRestore,
    whose extra arguments still pass through."""
    import tf_keras

    import keras
    import tfrun

    for flavour, module in (("0", keras), ("1", tf_keras)):
        monkeypatch.setenv("TF_USE_LEGACY_KERAS", flavour)
        callback = tfrun.backup_and_restore(str(tmp_path), save_freq=5)
        assert type(callback).__name__ == "ConsistentBackup" and callback.save_freq == 5
        assert isinstance(callback, module.callbacks.Callback)
        plain = tfrun.backup_and_restore(str(tmp_path))
        assert type(plain) is module.callbacks.BackupAndRestore
        with pytest.raises(ValueError, match=r"Received: \['save_before_preemption'\]"):
            tfrun.backup_and_restore(str(tmp_path), save_freq=5, save_before_preemption=True)


def test_the_resume_position_is_the_newest_any_replica_backed_up():
    """Synchronous replicas hold one state per step: the newest backup any of them holds
    is the cluster's (its holders load it, the first of them sends it to the others).
    Never the start while a replica holds a backup; a replica with only older or no
    backups (a spare, a returning host on a disk of its own) is no reason to go back."""
    from tfrun.in_task.backup.agree import Choice, choose

    assert choose([[3, 5, 7], [5, 7], [5]]) == Choice(7, 0, (0, 1))
    assert choose([[], []]) is None
    assert choose([[4294967296], []]) == Choice(4294967296, 0, (0,))  # a spare: from replica 0
    assert choose([[1, 2], [3, 4]]) == Choice(4, 1, (1,))  # a returning host's old backups
    assert choose([[7], [7]]).complete(2) and not choose([[7], []]).complete(2)


def test_the_preemption_watch_thread_ends_its_process_as_sigterm_would():
    """The watch thread cannot reset a handler through Python (main thread only): it still
    ends the process by SIGTERM at once, past the script's own handler, while the main
    thread is blocked (here in a sleep; in a task, in a collective on a dead peer)."""
    script = textwrap.dedent("""
        import signal, threading, time
        from tfrun.in_task.preemption import die_of_sigterm
        signal.signal(signal.SIGTERM, lambda *a: print("handled", flush=True))
        threading.Thread(target=die_of_sigterm).start()
        time.sleep(60)
        print("still alive", flush=True)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == -signal.SIGTERM, (out.returncode, out.stdout, out.stderr)
    assert out.stdout == "", out.stdout
