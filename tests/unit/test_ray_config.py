"""--backend ray: flags -> config, validation, mode (pure; tests/ray runs a real cluster)."""

import pytest

from tfrun.errors import ConfigError
from tfrun.launch import launch_mode
from tfrun.cli.run import config_from_args
from tfrun.launch.config import LaunchConfig
from tfrun.launch.engines import check_options
from tfrun.launch.engines.slurm.allocation import apply_slurm


def test_ray_flags_reach_the_config():
    config = config_from_args(["--backend", "ray", "--ray-address", "10.0.0.1:6379",
                               "--ray-placement", "pack", "--cpus-per-task", "0.5",
                               "--gpus-per-task", "1", "--workers", "2", "t.py"], environ={})
    assert (config.backend, config.ray_address, config.ray_placement) == (
        "ray", "10.0.0.1:6379", "pack")
    assert (config.cpus_per_task, config.gpus_per_task) == (0.5, 1.0)
    assert launch_mode(config) == "ray"


def test_defaults_are_not_ray():
    config = config_from_args(["t.py"], environ={})
    assert (config.backend, config.ray_address, config.ray_placement) == ("auto", "auto", "spread")
    assert (config.cpus_per_task, config.gpus_per_task) == (None, None)
    assert launch_mode(config) == "local"


def test_ray_wins_over_an_allocation():  # --backend ray inside sbatch: Ray places the tasks
    slurm = {"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n1"}
    config = config_from_args(["--backend", "ray", "t.py"], environ=slurm)
    assert config.tasks_per_node is None
    placed, job = apply_slurm(config, slurm)
    assert (placed, job) == (config, None)
    assert launch_mode(placed) == "ray"


@pytest.mark.parametrize("kw, named", [
    ({"backend": "k8s"}, "'k8s'"),
    ({"ray_placement": "scatter"}, "'scatter'"),
    ({"backend": "ray", "cpus_per_task": 0.0}, "cannot run a task on 0 CPUs"),  # local: 0 = shared
    ({"cpus_per_task": float("inf")}, "inf"),
    ({"gpus_per_task": -1.0}, "GPUs >= 0"),
    ({"backend": "ray", "hosts": ("a", "b")}, "--hosts a,b"),
    ({"backend": "ray", "node_rank": 0, "hosts": ("a",)}, "--node-rank"),
])
def test_bad_ray_settings_are_named(kw, named):
    # The config checks what is common; the engines check their own (check_options, which
    # the CLI and launch() call).
    with pytest.raises(ConfigError, match=named.replace("+", r"\+").replace("(", r"\(")):
        check_options(LaunchConfig(entrypoint=("script", "t.py"), **kw))
