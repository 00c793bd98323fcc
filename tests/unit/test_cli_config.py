"""`tfrun config` end to end through the real console script (subprocess, no TensorFlow)."""

import json
import os
import subprocess
import sys

import pytest


def tfrun(*args, env=None):
    return subprocess.run([sys.executable, "-m", "tfrun", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=60)


def test_uai_layout_prints_eight_configs_with_one_cluster_and_unique_addresses():
    result = tfrun("config", "--hosts", "ip0,ip1,ip2,ip3", "--layout", "uai")
    assert result.returncode == 0, result.stderr
    configs = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(configs) == 8
    assert sorted(c["task"]["type"] for c in configs) == ["chief"] + ["ps"] * 4 + ["worker"] * 3
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    own = [configs[0]["cluster"][c["task"]["type"]][c["task"]["index"]] for c in configs]
    assert len(set(own)) == 8


def test_check_normalises_master_to_chief():
    result = tfrun("config", "--check", '{"cluster":{"master":["a:1"],"worker":["b:1"]},'
                                        '"task":{"type":"master","index":0}}')
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out == {"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                   "task": {"type": "chief", "index": 0}}


def test_check_reads_tf_config_from_the_environment():
    env = {"TF_CONFIG": '{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":0}}'}
    result = tfrun("config", "--check", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["task"] == {"type": "worker", "index": 0}


@pytest.mark.parametrize("bad", [
    '{"cluster":',
    '{"cluster":{"boss":["a:1"]},"task":{"type":"worker","index":0}}',
    '{"cluster":{"worker":["a:1"]},"task":{"type":"worker","index":5}}',
    '{"cluster":{"worker":["a:1","a:1"]},"task":{"type":"worker","index":0}}',
    '{"cluster":{"worker":["a:99999"]},"task":{"type":"worker","index":0}}',
    '{"cluster":{"chief":["a:1","b:1"]},"task":{"type":"chief","index":0}}',
    '{"cluster":{"ps":["a:1"]},"task":{"type":"ps","index":0}}',
    '{"cluster":{},"task":{"type":"worker","index":0}}',
    '{"cluster":{"worker":["a:1"]},"task":{"type":"evaluator","index":2}}',
])
def test_bad_input_exits_2_with_one_paragraph_and_no_traceback(bad):
    result = tfrun("config", "--check", bad)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tfrun: error: ")
    assert "Received:" in lines[0]


def test_missing_tf_config_for_check_is_a_clear_error():
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    result = subprocess.run([sys.executable, "-m", "tfrun", "config", "--check"], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "No TF_CONFIG to check" in result.stderr


def test_env_format_prints_paste_ready_export_lines():
    result = tfrun("config", "--workers", "2", "--format", "env")
    assert result.returncode == 0, result.stderr
    exports = [l for l in result.stdout.splitlines() if l.startswith("export TF_CONFIG=")]
    assert len(exports) == 2
    # Each line, run by a shell, must give back the same JSON.
    for i, line in enumerate(exports):
        shell = subprocess.run(["bash", "-c", f"{line}; printf %s \"$TF_CONFIG\""],
                               capture_output=True, text=True, check=True)
        assert json.loads(shell.stdout)["task"] == {"type": "worker", "index": i}


def test_role_counts_with_named_layout_is_a_usage_error():
    result = tfrun("config", "--hosts", "a,b", "--layout", "uai", "--workers", "3")
    assert result.returncode == 2 and "derives its roles" in result.stderr


def test_config_cli_does_not_import_tensorflow():
    code = ("import sys; from tfrun.cli import main; main(['config', '--workers', '1']); "
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("flags, hosts", [
    (["--chief", "--workers", "2", "--ps", "1"], ["localhost"] * 4),
    (["--hosts", "node-1,node-2"], ["node-1", "node-2"]),      # ssh: nothing connects
])
def test_dry_run_prints_every_task_s_tf_config_and_creates_nothing(tmp_path, flags, hosts):
    (tmp_path / "train.py").write_text("raise SystemExit('the dry run must not run me')\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    out = subprocess.run([sys.executable, "-m", "tfrun", "--dry-run", *flags, "train.py", "--lr", "1"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no run dir, nothing else
    configs = [json.loads(line.split(":", 1)[1]) for line in out.stdout.splitlines()
               if line.strip().startswith("TF_CONFIG")]
    tasks = [(c["task"]["type"], c["task"]["index"]) for c in configs]
    assert len(tasks) == len(hosts) and len(set(tasks)) == len(tasks), out.stdout
    addresses = [a for c in configs[:1] for role in c["cluster"].values() for a in role]
    assert [a.rsplit(":", 1)[0] for a in addresses] == hosts
    assert out.stdout.count("-m tfrun.in_task.start.bootstrap train.py --lr 1") == len(hosts)
    # The plan's budgets and clocks; a PS cluster's ps and workers serve, never run the script.
    assert "restarts   : max 0; join timeout 300s" in out.stdout
    assert out.stdout.count("(serves as a tf.distribute.Server") == (2 + 1 if "--ps" in flags
                                                                      else 0)
    # Issue 45.8: where the servers listen, and (local runs) how the CPUs are split.
    if "--hosts" in flags:
        assert "network    : each host's network" in out.stdout
        assert "placement" not in out.stdout
    else:
        assert "network    : auto: loopback -- TensorFlow servers on 127.0.0.1 only" in out.stdout
        assert "  placement  : " in out.stdout


def test_dry_run_shows_the_cpus_each_local_task_is_pinned_to(tmp_path):
    """--cpus-per-task 1: the placement line and each task's TFRUN_CPUS, as a launch sets
    them (the CPUs of this process's affinity, in order)."""
    import os

    (tmp_path / "train.py").write_text("")
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    out = subprocess.run([sys.executable, "-m", "tfrun", "--dry-run", "--workers", "2",
                          "--cpus-per-task", "1", "--network", "host", "train.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f"placement  : worker:0 CPU {cpus[0]}, worker:1 CPU {cpus[1]}" in out.stdout
    assert f"TFRUN_CPUS={cpus[0]} " in out.stdout and f"TFRUN_CPUS={cpus[1]} " in out.stdout
    assert "network    : host: TensorFlow servers reachable on every interface" in out.stdout


def test_help_texts_are_whole_and_plain(capsys):
    """Issue 45.7: no group description cut mid-sentence, no RST backticks or contract
    names in `tfrun bench --help`, and `tfrun k8s --help` lists no --hosts/--layout (which
    it refuses)."""
    from tfrun.cli.bench import run_bench
    from tfrun.cli.run import build_launch_parser
    from tfrun.launch.engines.kubernetes import _build_k8s_parser

    launch_help = build_launch_parser().format_help()
    assert "it starts that machine's tasks" in launch_help
    assert run_bench(["--help"]) == 0
    bench_help = capsys.readouterr().out
    assert "``" not in bench_help and "contract." not in bench_help and "TFRUN_REPORT=0" in bench_help
    k8s_help = _build_k8s_parser().format_help()
    assert "--hosts HOSTS" not in k8s_help and "--layout" not in k8s_help


def test_a_cluster_flag_after_the_script_is_the_script_s_and_tfrun_says_so(capsys):
    """``tfrun train.py --workers 2`` ran one process and gave ``--workers 2`` to the script
    without a word. The flag still goes to the script (it may take one), and tfrun says
    where tfrun's own go; before the script too, nothing is said."""
    from tfrun.cli.run import config_from_args

    config = config_from_args(["train.py", "--lr", "1", "--workers", "2"])
    assert config.script_args == ("--lr", "1", "--workers", "2")
    assert config.topology.workers == 1
    said = capsys.readouterr().err
    assert "--workers comes after train.py, so it is your script's argument" in said, said
    assert "put tfrun's options before the script: tfrun --workers 2 train.py" in said
    config_from_args(["train.py", "--chief"])
    assert "before the script: tfrun --chief train.py" in capsys.readouterr().err
    config_from_args(["--workers", "2", "train.py", "--workers", "2"])
    config_from_args(["train.py", "--epochs", "3"])
    assert capsys.readouterr().err == ""


def test_the_dry_run_refuses_what_the_run_refuses_and_shows_the_ports_it_will_use(tmp_path):
    """The dry run once showed --base-port's 2222/2223 for a local run that picks free
    ports, and accepted --workers 1000 and a --node-rank auto the run refuses."""
    (tmp_path / "train.py").write_text("print('hello')\n")

    def tfrun_in(*argv):
        return subprocess.run([sys.executable, "-m", "tfrun", *argv], cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    for flags in (["--workers", "1000"], ["--node-rank", "auto", "--hosts", "nohost-a,nohost-b"]):
        planned, started = tfrun_in("--dry-run", *flags, "train.py"), tfrun_in(*flags, "train.py")
        assert planned.returncode == started.returncode == 2, planned.stdout + planned.stderr
        assert planned.stderr.strip().splitlines()[-1] == started.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "runs").exists()

    loopback = tfrun_in("--dry-run", "--workers", "2", "--base-port", "3000", "train.py")
    assert "  ports      : free ones, picked when the run starts" in loopback.stdout
    assert "localhost:3000" not in loopback.stdout, loopback.stdout
    private = tfrun_in("--dry-run", "--workers", "2", "--network", "private", "--base-port",
                       "3000", "train.py")
    assert '"localhost:3000", "localhost:3001"' in private.stdout, private.stdout
    assert "  ports      :" not in private.stdout
