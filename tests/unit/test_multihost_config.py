"""Pure parts of multi-host launch: modes, node ranks, forwarded env, ssh argv, digests."""

import io
import json

import pytest

from tfrun.cluster import TaskId, Topology, plan_cluster
from tfrun.errors import ConfigError
from tfrun.launch import launch_mode
from tfrun.launch.engines.base import TaskSpec
from tfrun.launch.engines.ssh import agent_command, ssh_command
from tfrun.cli.run import config_from_args
from tfrun.launch.config import LaunchConfig
from tfrun.launch.engines.pernode import cluster_digest
from tfrun.launch.remote.protocol import Channel, ProtocolError
from tfrun.launch.network.rendezvous import distinct_hosts, resolve_node_rank
from tfrun.launch.specs import forwarded_env, spec_factory, task_hosts


def config(**kw) -> LaunchConfig:
    return LaunchConfig(entrypoint=("script", "train.py"), **kw)


@pytest.mark.parametrize("hosts, rank, mode", [
    (None, None, "local"),
    (("localhost", "127.0.0.1"), None, "local"),
    (("node-1", "node-2"), None, "ssh"),
    (("node-1:2222", "node-1:2300"), None, "ssh"),
    (("node-1", "node-2"), 0, "pernode"),
    (("node-1", "node-2"), "auto", "pernode"),
    (("localhost",), 0, "pernode"),
])
def test_launch_mode(hosts, rank, mode):
    assert launch_mode(config(hosts=hosts, node_rank=rank)) == mode


def test_loopback_mixed_with_other_hosts_is_refused():
    with pytest.raises(ConfigError, match="mixes loopback names"):
        launch_mode(config(hosts=("localhost", "node-2")))


def test_node_rank_needs_hosts():
    with pytest.raises(ConfigError, match="--node-rank needs --hosts"):
        launch_mode(config(node_rank=1))


@pytest.mark.parametrize("kw, message", [
    ({"node_rank": -1}, "--node-rank must be a rank"),
    ({"node_rank": "first"}, "--node-rank must be a rank"),
    ({"base_port": 0}, "--base-port is not a port"),
    ({"rdzv_port": 70000}, "--rdzv-port is not a port"),
    ({"run_id": "../escape"}, "is not a plain name"),
    ({"run_id": ".hidden"}, "is not a plain name"),
    ({"heartbeat_timeout": 0}, "--heartbeat-timeout must be positive"),
])
def test_bad_multihost_config_is_a_config_error(kw, message):
    with pytest.raises(ConfigError, match=message):
        config(**kw)


def test_distinct_hosts_keeps_first_appearance_order():
    assert distinct_hosts(["b:1", "a", "b:2", "c"]) == ["b", "a", "c"]


def test_node_rank_given_is_checked():
    assert resolve_node_rank(["a", "b", "a"], 1) == 1
    with pytest.raises(ConfigError, match="out of range for 2 node"):
        resolve_node_rank(["a", "b", "a"], 2)


def test_node_rank_auto_needs_exactly_one_local_host():
    assert resolve_node_rank(["a", "b"], None, is_local=lambda h: h == "b") == 1
    with pytest.raises(ConfigError, match="None of the --hosts entries is this machine"):
        resolve_node_rank(["a", "b"], None, is_local=lambda h: False)
    with pytest.raises(ConfigError, match="Several --hosts entries are this machine"):
        resolve_node_rank(["a", "b"], None, is_local=lambda h: True)


def test_localhost_is_local_and_an_unresolvable_name_is_not():
    from tfrun.launch.network.rendezvous import is_local_host

    assert is_local_host("localhost") and is_local_host("127.0.0.1")
    assert not is_local_host("no-such-host.invalid")


def test_forwarded_env_takes_training_variables_only():
    environ = {"TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow", "HOME": "/root",
               "AWS_SECRET": "x", "TF_CONFIG": "{}", "TFRUN_RUN_DIR": "/here", "PYTHONPATH": "/p",
               "MY_FLAG": "1"}
    assert forwarded_env(environ, ["MY_FLAG", "EXTRA=5", "UNSET_ONE"]) == {
        "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow", "PYTHONPATH": "/p",
        "MY_FLAG": "1", "EXTRA": "5"}


def test_remote_specs_carry_host_port_cwd_and_forwarded_env(tmp_path):
    plan = plan_cluster(Topology(chief=True, workers=1, ps=1, evaluator=True),
                        hosts=["n1", "n2", "n1"])
    cfg = config(hosts=("n1", "n2", "n1"), remote_dir="/work", forward_env=("A=1",))
    make = spec_factory(cfg, plan, tmp_path, with_tf_config=True, remote=True,
                        environ={"TF_X": "y", "HOME": "/h"})
    ps = make(TaskId("ps", 0), 2)
    assert (ps.host, ps.ports, ps.cwd) == ("n1", (2223,), "/work")
    assert ps.env["TF_X"] == "y" and ps.env["A"] == "1" and "HOME" not in ps.env
    assert ps.env["TFRUN_RESTART_COUNT"] == "2" and ps.env["TF_GRPC_REUSE_PORT"] == "1"
    assert json.loads(ps.env["TF_CONFIG"])["task"] == {"type": "ps", "index": 0}
    evaluator = make(TaskId("evaluator", 0), 0)
    assert evaluator.host == "n1" and evaluator.ports == ()  # the first task's host
    assert task_hosts(plan)[TaskId("worker", 0)] == "n2"
    local = spec_factory(cfg, plan, tmp_path, with_tf_config=True, remote=False,
                         environ={"TF_X": "y"})(TaskId("ps", 0), 0)
    assert local.host is None and local.ports == () and "TF_X" not in local.env


def test_task_spec_round_trips_through_json():
    spec = TaskSpec(task=TaskId("worker", 3), argv=("python", "x.py"), env={"A": "1"},
                    host="h", cwd="/w", ports=(2222,), run_dir="/r")
    assert TaskSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_ssh_command_puts_user_options_first_so_they_win():
    argv = ssh_command("node-2", "hostname", ["-o", "BatchMode=no", "-p", "22"])
    assert argv[:5] == ["ssh", "-o", "BatchMode=no", "-p", "22"]
    assert "BatchMode=yes" in argv and argv[-2:] == ["node-2", "hostname"]
    assert agent_command("/usr/bin/py thon", "/my dir") == \
        "cd '/my dir' && exec '/usr/bin/py thon' -m tfrun.launch.remote.agent"


def test_cluster_digest_is_stable_and_sees_every_difference():
    plan = plan_cluster(Topology(workers=2), hosts=["a", "b"])
    base = cluster_digest(config(hosts=("a", "b")), plan)
    assert base == cluster_digest(config(hosts=("a", "b"), max_restarts=3), plan)  # hub decides
    other_plan = plan_cluster(Topology(workers=2), hosts=["a", "b"], base_port=3000)
    assert base != cluster_digest(config(hosts=("a", "b")), other_plan)
    assert base != cluster_digest(config(hosts=("a", "b"), script_args=("--lr", "1")), plan)
    assert base != cluster_digest(config(hosts=("a", "b"), keras="2"), plan)


def test_cli_multihost_flags(monkeypatch):
    ssh_cfg = config_from_args(["--hosts", "a,b", "--ssh-opt", "-F /x/cfg", "--ssh-opt",
                                "-p 2200", "--env", "X=1", "--remote-dir", "/w", "--python", "/py",
                                "--base-port", "3000", "--heartbeat-timeout", "4", "--no-doctor",
                                "t.py"], environ={})
    assert ssh_cfg.ssh_opts == ("-F", "/x/cfg", "-p", "2200")
    assert (ssh_cfg.forward_env, ssh_cfg.remote_dir, ssh_cfg.python) == (("X=1",), "/w", "/py")
    assert ssh_cfg.base_port == 3000 and ssh_cfg.heartbeat_timeout == 4
    assert ssh_cfg.doctor is False
    # (per-node: this machine runs tasks with --python, which must exist here)
    cfg = config_from_args(["--hosts", "a,b", "--env", "X=1", "--python", "python3",
                            "--node-rank", "auto", "--base-port", "3000", "--rdzv-port", "3999",
                            "--heartbeat-timeout", "4", "t.py"],
                           environ={"SLURM_JOB_ID": "77"})
    assert (cfg.forward_env, cfg.python) == (("X=1",), "python3")
    assert (cfg.node_rank, cfg.base_port, cfg.rdzv_port) == ("auto", 3000, 3999)
    assert cfg.heartbeat_timeout == 4
    assert cfg.run_id == "slurm-77"  # every node of the allocation names the run the same
    explicit = config_from_args(["--hosts", "a,b", "--node-rank", "1", "--run-id", "r1", "t.py"],
                                environ={"SLURM_JOB_ID": "77"})
    assert explicit.run_id == "r1" and explicit.node_rank == 1
    ssh = config_from_args(["--hosts", "a,b", "t.py"], environ={"SLURM_JOB_ID": "77"})
    assert ssh.run_id is None
    from_env = config_from_args(["--hosts", "a,b", "t.py"],
                                environ={"TFRUN_DOCTOR": "0", "TFRUN_SSH_OPT": "-F /c"})
    assert from_env.doctor is False and from_env.ssh_opts == ("-F", "/c")


def test_channel_messages_and_garbage():
    out = io.BytesIO()
    Channel(io.BytesIO(), out).send("start", id=1, task="worker:0")
    reader = Channel(io.BytesIO(out.getvalue() + b"not json\n"), io.BytesIO())
    assert reader.receive() == {"t": "start", "id": 1, "task": "worker:0"}
    with pytest.raises(ProtocolError):
        reader.receive()
    assert Channel(io.BytesIO(b""), io.BytesIO()).receive() is None


def test_an_engine_option_from_the_environment_is_an_ambient_default_not_refused():
    # TFRUN_SSH_OPT set for every command (as the multi-host tests and a user's shell do)
    # does not stop a per-node launch; the same option typed for this launch is refused.
    env = {"TFRUN_SSH_OPT": "-F /cfg"}
    cfg = config_from_args(["--hosts", "a,b", "--node-rank", "auto", "t.py"], environ=env)
    assert cfg.from_environment == ("ssh_opts",) and cfg.ssh_opts == ("-F", "/cfg")
    with pytest.raises(ConfigError, match="--ssh-opt applies to the ssh engine only"):
        config_from_args(["--hosts", "a,b", "--node-rank", "auto", "--ssh-opt", "-F /x", "t.py"],
                         environ=env)


@pytest.mark.parametrize("argv, message", [
    (["--min-nodes", "0", "--hosts", "node-1,node-2"], "--min-nodes must be a number of hosts >= 1"),
    (["--min-nodes", "3", "--hosts", "node-1,node-2"], r"--min-nodes 3 asks for more hosts than --hosts names \(2\)"),
    (["--min-nodes", "2", "--workers", "2"], "which the local engine cannot do yet"),
    (["--min-nodes", "3", "--workers", "2", "--backend", "ray"],
     r"--min-nodes 3 asks for more nodes than the run has workers \(2\)"),
    (["--min-nodes", "1", "--workers", "2", "--backend", "ray", "--exclude-hosts", "n"],
     "Ray places this run's tasks on its nodes itself"),
    (["--min-nodes", "1", "--chief", "--backend", "ray"], "re-forms a cluster of workers only"),
    (["--exclude-hosts", "node-3", "--hosts", "node-1,node-2"], "this run has no --min-nodes"),
    (["--min-nodes", "1", "--exclude-hosts", "node-9", "--hosts", "node-1,node-2"],
     "--exclude-hosts names node-9, not in --hosts"),
    (["--min-nodes", "2", "--exclude-hosts", "node-2", "--hosts", "node-1,node-2"],
     r"asks for more hosts than --hosts names \(1, without --exclude-hosts\)"),
    (["--keep-global-batch", "--hosts", "node-1,node-2"], "this run has no --min-nodes"),
    (["--min-nodes", "1", "--chief", "--workers", "1", "--hosts", "node-1,node-2"],
     "re-forms a cluster of workers only"),
])
def test_bad_elastic_flags_are_named(argv, message):
    from tfrun.launch.engines import prepare

    with pytest.raises(ConfigError, match=message):
        prepare(config_from_args([*argv, "train.py"]), environ={})


ALLOCATION = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3]", "SLURMD_NODENAME": "n1"}


def test_in_a_slurm_allocation_min_nodes_keeps_the_unused_nodes_as_spares():
    """Issue 33 on Slurm: the flags alone cannot say where the tasks go, so --min-nodes is
    checked once the allocation has placed them; nodes without a task are spares."""
    from tfrun.launch.engines import prepare
    from tfrun.launch.engines.slurm.batch import sbatch_script
    from tfrun.launch.elastic_planning import elastic_plan

    parsed = config_from_args(["--min-nodes", "1", "--workers", "2", "train.py"], environ={})
    placed, engine = prepare(parsed, environ=ALLOCATION)
    assert engine.name == "slurm" and placed.hosts == ("n1:2222", "n2:2223", "n3:2224")
    _, plan = elastic_plan(placed)
    assert plan.cluster.as_dict() == {"worker": ["n1:2222", "n2:2223"]}
    _, plan = elastic_plan(placed, {"n2"})  # the spare takes the lost node's place
    assert plan.cluster.as_dict() == {"worker": ["n1:2222", "n3:2224"]}
    with pytest.raises(ConfigError, match="which the local engine cannot do yet"):
        prepare(parsed, environ={})  # outside an allocation: a local run
    step = {**ALLOCATION, "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-3]",
            "SLURM_STEP_TASKS_PER_NODE": "1(x3)"}
    with pytest.raises(ConfigError, match="under 'srun tfrun'"):
        prepare(parsed, environ=step)
    script = sbatch_script(nodes=3, tfrun_args=["--min-nodes", "2", "t.py"], job_name="t",
                           no_kill=True)
    assert "#SBATCH --no-kill\n" in script
    assert "--no-kill" not in sbatch_script(nodes=3, tfrun_args=["t.py"], job_name="t")
    from tfrun.launch.engines.slurm.batch import run_sbatch_script

    with pytest.raises(ConfigError, match=r"--min-nodes 3 asks for more nodes than the job "
                                          r"has \(--nodes 2\)"):
        run_sbatch_script(["--nodes", "2", "--min-nodes", "3", "t.py"], config_from_args)


def test_the_elastic_plan_drops_the_lost_hosts_entries_and_renumbers():
    from tfrun.launch.elastic_planning import elastic_plan

    given = config(hosts=("a", "b", "b", "c"), topology=Topology(workers=4), min_nodes=2)
    smaller, plan = elastic_plan(given, {"b"})
    assert smaller.hosts == ("a", "c") and smaller.topology.workers == 2
    assert plan.cluster.as_dict() == {"worker": ["a:2222", "c:2222"]}
    assert plan.task_config(TaskId("worker", 1)).to_dict()["task"] == {"type": "worker",
                                                                       "index": 1}
