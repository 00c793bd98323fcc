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


def test_the_ray_reform_places_the_workers_the_other_nodes_had_avoiding_the_lost_ones():
    """Issue 33 on Ray (pure: a stand-in placer records what a new placement group would be
    asked for; tests/ray loses a real node): a re-form removes the old group first, asks
    for the workers the first placement put on the nodes left, and names the nodes to
    avoid; the host count the policy sees is the first placement's nodes left."""
    from types import SimpleNamespace

    from tfrun.cluster import TaskId, Topology, plan_cluster
    from tfrun.launch.engines.ray import _RayElastic

    closed, asked = [], []

    class Group(SimpleNamespace):
        def close(self):
            closed.append(self.name)

    first = Group(name="first", nodes={TaskId("worker", 0): "10.0.0.1",
                                       TaskId("worker", 1): "10.0.0.2",
                                       TaskId("worker", 2): "10.0.0.2"})
    config = LaunchConfig(entrypoint=("script", "t.py"), topology=Topology(workers=3),
                          backend="ray", min_nodes=1)

    def place(tasks, avoid=frozenset()):
        asked.append((len(tasks), avoid))
        plan = plan_cluster(Topology(workers=len(tasks)),
                            hosts=[f"10.0.0.1:{2222 + i}" for i in range(len(tasks))])
        return plan, Group(name=f"group-{len(asked)}", nodes={})

    place.config = config
    reform = _RayElastic(place, first, lambda plan: {t: {} for t in plan.tasks}, "/tmp/run")
    assert reform.hosts_after(frozenset({"10.0.0.2"})) == 1
    assert reform.hosts_after(frozenset({"10.0.0.1", "10.0.0.2"})) == 0
    plan, backends, make_spec = reform(frozenset({"10.0.0.2"}))
    assert closed == ["first"] and asked == [(1, frozenset({"10.0.0.2"}))]
    assert plan.cluster.as_dict() == {"worker": ["10.0.0.1:2222"]}
    spec = make_spec(TaskId("worker", 0), 1)
    assert spec.env["TFRUN_HOSTS_AWAY"] == "10.0.0.2"
    reform(frozenset())  # the node is back: the three workers again, in a new group
    assert closed == ["first", "group-1"] and asked[-1] == (3, frozenset())
