"""Slurm placement, pure: node lists, job variables, where tasks go, the sbatch script."""

import json
import signal
import subprocess
import time

import pytest

from tfrun.cli import main
from tfrun.cluster import Topology
from tfrun.errors import ConfigError
from tfrun.launch import launch_mode
from tfrun.cli.run import config_from_args
from tfrun.launch.config import LaunchConfig
from tfrun.launch.engines import check_options
from tfrun.launch.engines.slurm.allocation import (SlurmJob, apply_slurm, expand_counts,
                                                   expand_nodelist, job_description, place_tasks)
from tfrun.launch.engines.slurm.batch import run_sbatch_script as _run_sbatch_script
from tfrun.launch.engines.slurm.batch import sbatch_script


def run_sbatch_script(argv):
    return _run_sbatch_script(argv, config_from_args)

BATCH = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURMD_NODENAME": "n1"}
STEP = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_STEP_ID": "3",
        "SLURM_STEP_NODELIST": "n[2-3]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
        "SLURMD_NODENAME": "n3"}


@pytest.mark.parametrize("text, hosts", [
    ("n1", ["n1"]),
    ("n1,n2", ["n1", "n2"]),
    ("n[1-3]", ["n1", "n2", "n3"]),
    ("gpu-[01-03,7]", ["gpu-01", "gpu-02", "gpu-03", "gpu-7"]),
    ("n[08-11]", ["n08", "n09", "n10", "n11"]),
    ("n[1,3-4],login", ["n1", "n3", "n4", "login"]),
    ("r[1-2]-n[1-2]", ["r1-n1", "r1-n2", "r2-n1", "r2-n2"]),
    ("a[1-2]b,c[5]", ["a1b", "a2b", "c5"]),
    ("node-[001-002].ib", ["node-001.ib", "node-002.ib"]),
])
def test_expand_nodelist_like_scontrol_show_hostnames(text, hosts):
    assert expand_nodelist(text) == hosts


@pytest.mark.parametrize("text, why", [
    ("", "empty"), ("n[3-1]", "backwards"), ("n[1-2", "unbalanced"), ("n[a-b]", "not a number"),
    ("n1-2]", "unbalanced"),
])
def test_bad_nodelists_are_named(text, why):
    with pytest.raises(ConfigError, match=why) as info:
        expand_nodelist(text)
    assert repr(text) in str(info.value)


def test_expand_counts():
    assert expand_counts("1") == [1]
    assert expand_counts("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(ConfigError, match="2x3"):
        expand_counts("2x3")


def test_job_outside_slurm_is_none():
    assert SlurmJob.from_environ({}) is None


def test_batch_step_and_salloc_shell_are_launchers_over_the_whole_job():
    job = SlurmJob.from_environ(BATCH)
    assert (job.job_id, job.nodes, job.node_name, job.mode) == ("42", ("n1", "n2"), "n1", "launcher")
    salloc = SlurmJob.from_environ({"SLURM_JOBID": "5", "SLURM_NODELIST": "c[1-2]"})
    assert (salloc.nodes, salloc.node_name, salloc.mode) == (("c1", "c2"), None, "launcher")


def test_srun_tfrun_is_per_node_over_the_steps_nodes():
    job = SlurmJob.from_environ(STEP)
    assert (job.mode, job.nodes, job.node_rank()) == ("pernode", ("n2", "n3"), 1)
    single = SlurmJob.from_environ({**STEP, "SLURM_STEP_NODELIST": "n2",
                                    "SLURM_STEP_TASKS_PER_NODE": "1"})
    assert single.mode == "launcher"  # srun -n1 tfrun: one tfrun, it places the whole job


def test_per_node_needs_one_tfrun_per_node():
    job = SlurmJob.from_environ({**STEP, "SLURM_STEP_TASKS_PER_NODE": "2,1"})
    with pytest.raises(ConfigError, match="--ntasks-per-node=1"):
        job.node_rank()
    stranger = SlurmJob.from_environ({**STEP, "SLURMD_NODENAME": "n9"})
    with pytest.raises(ConfigError, match="SLURMD_NODENAME=n9"):
        stranger.node_rank()


def test_job_without_nodelist_is_an_error():
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST unset"):
        SlurmJob.from_environ({"SLURM_JOB_ID": "1"})


def test_placement_one_worker_per_node_with_distinct_ports():
    topology, hosts = place_tasks(Topology(), ["a", "b", "c"], tasks_per_node=1, base_port=3000)
    assert topology == Topology(workers=3)
    assert hosts == ("a:3000", "b:3001", "c:3002")


def test_placement_k_per_node_in_blocks_chief_first_ps_round_robin():
    topology, hosts = place_tasks(Topology(chief=True, ps=3, evaluator=True), ["a", "b"],
                                  tasks_per_node=2, base_port=2222)
    assert topology == Topology(workers=4, chief=True, ps=3, evaluator=True)
    assert [h.split(":")[0] for h in hosts] == ["a", "a", "a", "b", "b", "a", "b", "a"]
    assert len({h.split(":")[1] for h in hosts}) == len(hosts)


def test_placement_explicit_worker_count_spreads_over_nodes():
    _, hosts = place_tasks(Topology(workers=3), ["a", "b"], tasks_per_node=None, base_port=1)
    assert [h.split(":")[0] for h in hosts] == ["a", "a", "b"]
    _, hosts = place_tasks(Topology(workers=1), ["a", "b"], tasks_per_node=None, base_port=1)
    assert hosts == ("a:1",)


def test_placement_errors():
    with pytest.raises(ConfigError, match="--tasks-per-node"):
        place_tasks(Topology(), ["a"], tasks_per_node=0, base_port=2222)
    with pytest.raises(ConfigError, match="65500"):
        place_tasks(Topology(), ["a"] * 100, tasks_per_node=1, base_port=65500)


def config(**kw) -> LaunchConfig:
    return LaunchConfig(entrypoint=("script", "t.py"), **kw)


def test_apply_slurm_launcher_mode():
    placed, job = apply_slurm(config(tasks_per_node=1), BATCH)
    assert (placed.slurm, placed.hosts, job.job_id) == ("launcher", ("n1:2222", "n2:2223"), "42")
    assert launch_mode(placed) == "slurm"
    assert placed.resume_key == "slurm-42"  # a requeued job finds its run directory again


def test_apply_slurm_all_tasks_on_this_node_is_a_local_run():
    placed, _ = apply_slurm(config(topology=Topology(workers=2)),
                            {**BATCH, "SLURM_JOB_NODELIST": "n1"})
    assert (placed.slurm, placed.hosts, placed.topology.workers) == ("local", None, 2)
    assert launch_mode(placed) == "local"
    assert placed.resume_key == "slurm-42"


def test_apply_slurm_per_node_mode_gets_rank_and_shared_run_id():
    placed, _ = apply_slurm(config(tasks_per_node=1), STEP)
    assert (placed.slurm, placed.node_rank, placed.run_id) == ("pernode", 1, "slurm-42.3")
    assert placed.hosts == ("n2:2222", "n3:2223")
    assert launch_mode(placed) == "pernode"
    kept, _ = apply_slurm(config(tasks_per_node=1, run_id="mine"), STEP)
    assert kept.run_id == "mine"


def test_apply_slurm_does_not_apply():
    plain = config()
    assert apply_slurm(plain, {}) == (plain, None)
    off = config(slurm="off")
    assert apply_slurm(off, BATCH) == (off, None)
    by_hand = config(hosts=("x", "y"))
    assert apply_slurm(by_hand, BATCH) == (by_hand, None)  # --hosts: the user placed it


@pytest.mark.parametrize("kw, env, match", [
    ({"slurm": "on"}, {}, "SLURM_JOB_ID unset"),
    ({"tasks_per_node": 2}, {}, "--tasks-per-node 2"),
    ({"slurm": "on", "hosts": ("x",)}, BATCH, "--hosts x"),
    ({"tasks_per_node": 1, "hosts": ("x",)}, BATCH, "--hosts x"),
    ({"layout": "uai"}, BATCH, "uai"),
])
def test_apply_slurm_errors(kw, env, match):
    with pytest.raises(ConfigError, match=match):
        apply_slurm(config(**kw), env)


def test_config_rejects_bad_slurm_fields():
    with pytest.raises(ConfigError, match="'maybe'"):
        check_options(config(slurm="maybe"))
    with pytest.raises(ConfigError, match="Received: 0"):
        check_options(config(tasks_per_node=0))


def test_cli_default_inside_an_allocation_is_one_worker_per_node():
    assert config_from_args(["t.py"], environ=BATCH).tasks_per_node == 1
    assert config_from_args(["--workers", "3", "t.py"], environ=BATCH).tasks_per_node is None
    assert config_from_args(["t.py"], environ={}).tasks_per_node is None
    assert config_from_args(["--slurm", "off", "t.py"], environ=BATCH).tasks_per_node is None
    assert config_from_args(["--hosts", "a,b", "t.py"], environ=BATCH).tasks_per_node is None
    with pytest.raises(ConfigError, match="--workers 2 --tasks-per-node 2"):
        config_from_args(["--workers", "2", "--tasks-per-node", "2", "t.py"], environ={})


def test_job_description():
    assert job_description({}) == ""
    assert job_description(BATCH) == "Slurm job 42 on n[1-2]"
    assert job_description(STEP) == "Slurm job 42, step 3 on n[2-3]"


def test_sbatch_script_options():
    text = sbatch_script(nodes=4, tfrun_args=["--chief", "train.py", "--lr", "0.1 0.2"],
                         job_name="train", time="1:00:00", partition="gpu", gpus_per_node=2,
                         cpus_per_node=16)
    assert "#SBATCH --nodes=4\n" in text and "#SBATCH --gpus-per-node=2\n" in text
    assert "#SBATCH --cpus-per-task=16\n" in text and "--exclusive" not in text
    assert "#SBATCH --partition=gpu\n#SBATCH --time=1:00:00\n" in text
    assert "\ntfrun --chief train.py --lr '0.1 0.2' &\n" in text
    assert "#SBATCH --requeue\n#SBATCH --signal=B:USR1@120\n" in text
    assert "trap 'requeue=1; kill -TERM \"$tfrun_pid\"' USR1\n" in text
    assert 'if [ -n "${requeue:-}" ]; then scontrol requeue "$SLURM_JOB_ID"; fi\n' in text
    bare = sbatch_script(nodes=1, tfrun_args=["train.py"], job_name="t", notice=0)
    assert bare.endswith("\ntfrun train.py\n") and "requeue" not in bare


@pytest.mark.parametrize("warned", [False, True], ids=["runs-out", "usr1"])
def test_sbatch_script_runs_and_returns_tfruns_exit_code(tmp_path, warned):
    """The script's wait loop, run by bash with a stand-in tfrun: its exit code comes
    back. With USR1 (the time-limit warning), the script stops tfrun with SIGTERM, waits
    for it to end (its save), and only then requeues the job (a stand-in scontrol)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    events = tmp_path / "events"
    (bin_dir / "tfrun").write_text(
        f"#!/bin/bash\ntrap 'sleep 0.5; echo stopped >> {events}; exit 143' TERM\n"
        "sleep 2 & wait $!\nexit 7\n")
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\necho \"$@\" >> {events}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    script = tmp_path / "job.sh"
    script.write_text(sbatch_script(nodes=1, tfrun_args=["train.py"], job_name="t"))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_ID": "42"}
    job = subprocess.Popen(["bash", str(script)], env=env)
    if warned:
        time.sleep(0.5)
        job.send_signal(signal.SIGUSR1)
        assert job.wait(timeout=20) == 143
        assert events.read_text() == "stopped\nrequeue 42\n"  # saved, then requeued
    else:
        assert job.wait(timeout=20) == 7
        assert not events.exists()


def test_tfrun_slurm_prints_the_script(capsys):
    assert run_sbatch_script(["--nodes", "2", "--time=5:00", "--workers", "4", "train.py",
                              "--nodes", "9"]) == 0
    out = capsys.readouterr().out
    assert "#SBATCH --job-name=train\n" in out and "#SBATCH --time=5:00\n" in out
    # everything from the first tfrun flag on is the tfrun line, the script's --nodes too
    assert "\ntfrun --workers 4 train.py --nodes 9 &\n" in out


def test_tfrun_slurm_needs_nodes(capsys):
    with pytest.raises(SystemExit):
        run_sbatch_script(["train.py"])
    assert "--nodes" in capsys.readouterr().err


def test_tfrun_config_slurm(monkeypatch, capsys):
    for key, value in BATCH.items():
        monkeypatch.setenv(key, value)
    assert main(["config", "--slurm", "--chief", "--tasks-per-node", "2"]) == 0
    configs = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert configs[0]["cluster"] == {"chief": ["n1:2222"],
                                     "worker": ["n1:2223", "n1:2224", "n2:2225", "n2:2226"]}
    assert len(configs) == 5
    assert main(["config", "--tasks-per-node", "2"]) == 2  # without --slurm: an error


def test_a_notice_shorter_than_the_preemption_grace_is_refused(capsys):
    from tfrun.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--notice 20 is shorter than the tfrun line's "
                                          r"--preemption-grace 30.*Pass --notice 60 or more.*"
                                          r"Received: --notice 20"):
        run_sbatch_script(["--nodes", "2", "--notice", "20", "train.py"])
    assert run_sbatch_script(["--nodes", "2", "--notice", "20", "--preemption-grace", "15",
                              "train.py"]) == 0
    assert "--signal=B:USR1@20" in capsys.readouterr().out
