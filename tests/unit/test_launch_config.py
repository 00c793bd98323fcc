"""Launch flags -> LaunchConfig, including TFRUN_* environment defaults."""

import pytest

from tfrun.cluster import TaskId, Topology
from tfrun.errors import ConfigError
from tfrun.cli.run import config_from_args
from tfrun.launch.config import LaunchConfig


def test_flags_build_a_frozen_config():
    config = config_from_args(["--workers", "2", "--chief", "--max-restarts", "3", "train.py",
                               "--epochs", "5", "-v"], environ={})
    assert config.entrypoint == ("script", "train.py")
    assert config.script_args == ("--epochs", "5", "-v")
    assert config.topology == Topology(workers=2, chief=True)
    assert config.max_restarts == 3
    with pytest.raises(AttributeError):
        config.max_restarts = 4  # type: ignore[misc]


def test_module_entrypoint():
    config = config_from_args(["-m", "pkg.train", "--lr", "0.1"], environ={})
    assert config.entrypoint == ("module", "pkg.train") and config.script_args == ("--lr", "0.1")


def test_environment_supplies_defaults_and_flags_win():
    env = {"TFRUN_WORKERS": "3", "TFRUN_JOIN_TIMEOUT": "12.5", "TFRUN_QUIET_TASKS": "yes",
           "TFRUN_KERAS": "2", "TFRUN_MAX_RESTARTS": "4"}
    config = config_from_args(["--max-restarts", "1", "t.py"], environ=env)
    assert config.topology.workers == 3 and config.join_timeout == 12.5
    assert config.quiet_tasks is True and config.keras == "2"
    assert config.max_restarts == 1


@pytest.mark.parametrize("env, message", [
    ({"TFRUN_WORKERS": "two"}, "TFRUN_WORKERS is invalid"),
    ({"TFRUN_QUIET_TASKS": "maybe"}, "TFRUN_QUIET_TASKS is not a boolean"),
    ({"TFRUN_STRATEGY": "magic"}, "TFRUN_STRATEGY is not a valid choice"),
])
def test_bad_environment_values_are_config_errors(env, message):
    with pytest.raises(ConfigError, match=message):
        config_from_args(["t.py"], environ=env)


def test_no_script_is_a_config_error():
    with pytest.raises(ConfigError, match="No script given"):
        config_from_args([], environ={})


def test_tracked_roles():
    tracked = LaunchConfig.tracked
    assert tracked(TaskId("chief", 0), ps_cluster=False)
    assert tracked(TaskId("worker", 1), ps_cluster=False)
    assert not tracked(TaskId("worker", 1), ps_cluster=True, has_chief=True)  # PS servers
    assert tracked(TaskId("worker", 1), ps_cluster=True, has_chief=False)     # TF1 style
    assert not tracked(TaskId("ps", 0), ps_cluster=True)
    assert not tracked(TaskId("evaluator", 0), ps_cluster=False)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_restarts=-1), "--max-restarts is negative"),
    (dict(join_timeout=0), "--join-timeout must be positive"),
    (dict(hang_timeout=0), "--hang-timeout must be a positive number"),
    (dict(hang_timeout=float("nan")), "--hang-timeout must be a positive number"),
    (dict(hang_timeout=float("inf")), "--hang-timeout must be a positive number"),
    (dict(strategy="x"), "Unknown strategy"),
    (dict(keras="4"), "Unknown Keras flavour"),
    (dict(roles="x"), "Unknown role mode"),
    (dict(devices=0), "--devices must be at least 1"),
    (dict(entrypoint=("script", "")), "Nothing to run"),
])
def test_launch_config_validation(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        LaunchConfig(**{"entrypoint": ("script", "t.py"), **kwargs})


def test_dash_m_after_the_script_belongs_to_the_script():
    config = config_from_args(["--workers", "2", "train.py", "-m", "x"], environ={})
    assert config.entrypoint == ("script", "train.py") and config.script_args == ("-m", "x")
