"""Runtime helpers that read only the environment (no TensorFlow needed)."""

import json
import os

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


@pytest.mark.parametrize("save_freq", [5, 1, "batch"])
def test_backup_and_restore_refuses_step_level_backups_it_cannot_resume_exactly(save_freq):
    """Issue 14.3: Keras re-runs the interrupted epoch from its first step, so a step-level
    backup would apply steps twice; refused with the value and the fix named."""
    import tfrun

    with pytest.raises(ValueError, match=rf"save_freq={save_freq!r}.*Expected save_freq='epoch'"):
        tfrun.backup_and_restore(save_freq=save_freq)
