"""Issue 14.12: every malformed input -> exit 2, one clear message naming the value, no
traceback, nothing left behind (no process, no run directory, no stray file).

One table; each row runs the real CLI (``python -m tfrun``) in a scratch directory that
holds a few fixtures (a good script, a broken one, a finished run, ...).
"""

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

GOOD = "good.py"
W2 = ["--workers", "2"]
HUGE = "9" * 5001
NESTED = "[" * 50_000 + "]" * 50_000  # under the 128 KiB per-argument limit

# (id, argv, text the message must contain)
CASES = [
    # ---- topology
    ("workers-negative", ["--workers", "-1", GOOD], "-1"),
    ("workers-word", ["--workers", "two", GOOD], "'two'"),
    ("workers-float", ["--workers", "1.5", GOOD], "'1.5'"),
    ("workers-30000", ["--workers", "30000", GOOD], "30000 tasks"),
    ("workers-11-digits", ["--workers", "99999999999", GOOD], "99999999999"),
    ("workers-5001-digits", ["--workers", HUGE, GOOD], "5001 characters"),
    ("workers-300-local", ["--workers", "300", GOOD], "300 tasks"),
    ("ps-negative", ["--ps", "-2", GOOD], "-2"),
    ("ps-without-workers", ["--workers", "0", "--ps", "1", GOOD], "ps=1"),
    ("no-chief-no-worker", ["--workers", "0", GOOD], "no chief and no worker"),
    # (it hung for ever: every task a server, nobody coordinating)
    ("script-is-a-directory", [*W2, "adir"], "'adir' is a directory, not a script"),
    ("ps-without-chief", ["--workers", "2", "--ps", "1", GOOD],
     "needs a chief: with --ps, tfrun runs the ps and workers as servers"),
    ("devices-zero", [*W2, "--devices", "0", GOOD], "Received: 0"),
    ("devices-negative", [*W2, "--devices", "-1", GOOD], "-1"),
    # ---- seconds
    ("join-timeout-nan", [*W2, "--join-timeout", "nan", GOOD], "'nan'"),
    ("join-timeout-inf", [*W2, "--join-timeout", "inf", GOOD], "'inf'"),
    ("join-timeout-zero", [*W2, "--join-timeout", "0", GOOD], "'0'"),
    ("join-timeout-negative", [*W2, "--join-timeout", "-5", GOOD], "'-5'"),
    ("stop-grace-nan", [*W2, "--stop-grace", "nan", GOOD], "'nan'"),
    ("stop-grace-word", [*W2, "--stop-grace", "soon", GOOD], "'soon'"),
    ("hang-timeout-zero", [*W2, "--hang-timeout", "0", GOOD], "'0'"),
    ("hang-timeout-nan", [*W2, "--hang-timeout", "nan", GOOD], "'nan'"),
    ("evaluator-grace-nan", [*W2, "--evaluator-grace", "NaN", GOOD], "'NaN'"),
    ("heartbeat-timeout-inf", [*W2, "--heartbeat-timeout", "Infinity", GOOD], "'Infinity'"),
    ("max-restarts-negative", [*W2, "--max-restarts", "-1", GOOD], "'-1'"),
    ("max-restarts-float", [*W2, "--max-restarts", "1.5", GOOD], "'1.5'"),
    ("max-worker-restarts-word", [*W2, "--max-worker-restarts", "x", GOOD], "'x'"),
    # ---- choices
    ("strategy", [*W2, "--strategy", "mirrorred", GOOD], "'mirrorred'"),
    # issue 45.11: a one-process strategy forced on a cluster would train N times apart
    ("strategy-mirrored-on-a-cluster", [*W2, "--strategy", "mirrored", GOOD],
     "--strategy mirrored with Topology(workers=2"),
    ("strategy-central-with-ps", ["--chief", "--workers", "1", "--ps", "1", "--strategy",
                                  "central", GOOD], "--strategy central with Topology("),
    ("keras", [*W2, "--keras", "4", GOOD], "'4'"),
    ("roles", [*W2, "--roles", "manual", GOOD], "'manual'"),
    ("layout", [*W2, "--layout", "k8s", GOOD], "'k8s'"),
    ("network", [*W2, "--network", "open", GOOD], "'open'"),
    ("color", [*W2, "--color", "sometimes", GOOD], "'sometimes'"),
    # ---- ports and ranks
    ("base-port-zero", [*W2, "--base-port", "0", GOOD], "'0'"),
    ("base-port-big", [*W2, "--base-port", "70000", GOOD], "'70000'"),
    ("base-port-word", [*W2, "--base-port", "http", GOOD], "'http'"),
    ("rdzv-port-zero", [*W2, "--rdzv-port", "0", GOOD], "'0'"),
    ("node-rank-negative", [*W2, "--node-rank", "-1", GOOD], "'-1'"),
    ("node-rank-word", [*W2, "--node-rank", "first", GOOD], "'first'"),
    ("node-rank-without-hosts", [*W2, "--node-rank", "0", GOOD], "--node-rank 0"),
    # ---- names
    ("name-escapes-runs", [*W2, "--name", "../../x", GOOD], "'../../x'"),
    ("name-slash", [*W2, "--name", "a/b", GOOD], "'a/b'"),
    ("name-dot", [*W2, "--name", ".hidden", GOOD], "'.hidden'"),
    ("run-id-escapes", [*W2, "--run-id", "../x", GOOD], "'../x'"),
    ("show-typo", [*W2, "--show", "wrker", GOOD], "'wrker'"),
    ("show-missing-task", [*W2, "--show", "worker:7", GOOD], "'worker:7'"),
    ("env-empty-name", [*W2, "--env", "=x", GOOD], "'=x'"),
    ("env-bad-name", [*W2, "--env", "1BAD=x", GOOD], "'1BAD=x'"),
    ("ssh-opt-unclosed-quote", ["--hosts", "node-1,node-2", "--ssh-opt", "-o 'x", GOOD], "-o 'x"),
    # ---- hosts
    ("hosts-empty", ["--hosts", "", GOOD], "--hosts"),
    ("hosts-three-colons", ["--hosts", "a:b:c", GOOD], "'a:b:c'"),
    ("hosts-port-word", ["--hosts", "localhost:http", GOOD], "localhost:http"),
    ("hosts-port-big", ["--hosts", "localhost:99999,localhost:23002", GOOD], "99999"),
    ("hosts-aliases-one-port", ["--hosts", "localhost:2222,127.0.0.1:2222", GOOD],
     "'127.0.0.1:2222'"),
    ("hosts-wildcard", ["--hosts", "0.0.0.0:2222,localhost:2223", GOOD], "'0.0.0.0:2222'"),
    ("hosts-loopback-and-remote", ["--hosts", "localhost,node-1", GOOD], "localhost"),
    ("hosts-count-mismatch", ["--workers", "3", "--hosts", "localhost:23001,localhost:23002", GOOD],
     "3"),
    ("hosts-non-utf8", ["--hosts", b"local\xffhost:1,localhost:2", GOOD], "udcff"),
    ("hosts-unclosed-v6", ["--hosts", "[::1:2222,localhost:23002", GOOD], "[::1:2222"),
    # ---- what to run
    ("no-script", [*W2], "No script"),
    ("script-missing", [*W2, "nosuch.py"], "'nosuch.py'"),
    ("script-is-directory", [*W2, "adir"], "'adir'"),
    ("script-syntax-error", [*W2, "broken.py"], "broken.py:2"),
    ("script-null-bytes", [*W2, "nul.py"], "nul.py"),
    ("module-missing", [*W2, "-m", "missing.module"], "'missing.module'"),
    ("module-submodule-missing", [*W2, "-m", "pkg.nope"], "'pkg.nope'"),
    ("module-package-without-main", [*W2, "-m", "pkg"], "'pkg'"),
    ("module-syntax-error", [*W2, "-m", "pkg.broken"], "broken.py"),
    # ---- run directory
    ("run-dir-is-a-file", [*W2, "--run-dir", "afile", GOOD], "afile"),
    ("run-dir-under-proc", [*W2, "--run-dir", "/proc/self/tfrun-run", GOOD], "/proc/self"),
    ("run-dir-finished", [*W2, "--run-dir", "done", GOOD], "done"),
    ("run-dir-in-use", [*W2, "--run-dir", "busy", GOOD], "in use by another tfrun (pid 4242)"),
    ("run-dir-read-only", [*W2, "--run-dir", "ro/run", GOOD], "ro/run"),
    ("run-dir-disk-full", [*W2, "--run-dir", "full/run", GOOD], "disk is full"),
    # ---- tfrun config
    ("config-5001-digit-index", ["config", "--check",
                                 '{"cluster":{"worker":["a:1"]},"task":{"type":"worker",'
                                 f'"index":{HUGE}}}}}'], "TF_CONFIG"),
    ("config-nested-json", ["config", "--check", NESTED], "nested too deeply"),
    ("config-not-json", ["config", "--check", "{cluster: 1}"], "not valid JSON"),
    ("config-empty", ["config", "--check", ""], "TF_CONFIG is empty"),
    # ---- Slurm
    ("tasks-per-node-zero", ["--tasks-per-node", "0", GOOD], "Received: 0"),
    ("tasks-per-node-and-workers", ["--tasks-per-node", "2", *W2, GOOD], "--workers 2"),
    ("tasks-per-node-outside-slurm", ["--tasks-per-node", "2", GOOD], "--tasks-per-node 2"),
    ("slurm-on-outside-slurm", [*W2, "--slurm", "on", GOOD], "SLURM_JOB_ID unset"),
    ("slurm-choice", [*W2, "--slurm", "yes", GOOD], "'yes'"),
    ("slurm-bad-nodelist", [*W2, GOOD], "'n[3-1]'"),
    ("slurm-two-per-node-srun", [*W2, GOOD], "SLURM_STEP_TASKS_PER_NODE 2,2"),
    ("sbatch-nodes-zero", ["slurm", "--nodes", "0", GOOD], "Received: 0"),
    ("sbatch-bad-tfrun-line", ["slurm", "--nodes", "2", "--workers", "x", GOOD], "'x'"),
    ("config-slurm-outside", ["config", "--slurm"], "SLURM_JOB_ID unset"),
    # ---- Ray
    ("backend-choice", [*W2, "--backend", "k8s", GOOD], "'k8s'"),
    ("ray-placement-choice", [*W2, "--backend", "ray", "--ray-placement", "scatter", GOOD],
     "'scatter'"),
    ("cpus-per-task-zero", [*W2, "--backend", "ray", "--cpus-per-task", "0", GOOD],
     "Received: --cpus-per-task 0"),
    ("gpus-per-task-negative", [*W2, "--backend", "ray", "--gpus-per-task", "-1", GOOD], "'-1'"),
    ("gpus-per-task-nan", [*W2, "--backend", "ray", "--gpus-per-task", "nan", GOOD], "'nan'"),
    ("ray-with-hosts", ["--backend", "ray", "--hosts", "a,b", GOOD], "--hosts a,b"),
    ("ray-not-installed", [*W2, "--backend", "ray", GOOD], "pip install -e '.[ray]'"),
    ("ray-unreachable", [*W2, "--backend", "ray", "--ray-address", "127.0.0.9:9", GOOD],
     "127.0.0.9:9"),
    ("ray-address-no-port", [*W2, "--backend", "ray", "--ray-address", "127.0.0.9", GOOD],
     "'127.0.0.9' has no port"),
    # ---- Kubernetes
    ("k8s-no-image", ["k8s", GOOD], "--image"),
    ("k8s-bad-name", ["k8s", "--image", "i", "--name", "Bad_Name", GOOD], "'Bad_Name'"),
    ("k8s-check-missing", ["k8s", "--check", "nope.yaml"], "nope.yaml"),
    ("k8s-check-not-a-manifest", ["k8s", "--check", GOOD], "good.py"),
    # ---- a flag only another engine reads (it would be ignored): named with the engine
    ("ray-flag-on-local", [*W2, "--ray-address", "10.0.0.1:6379", GOOD],
     "--ray-address applies to the ray engine only"),
    ("rdzv-port-on-local", [*W2, "--rdzv-port", "3000", GOOD],
     "--rdzv-port applies to the pernode engine only"),
    ("ssh-opt-on-local", [*W2, "--ssh-opt", "-p 2200", GOOD],
     "--ssh-opt applies to the ssh engine only"),
    ("network-on-ssh", ["--hosts", "node-1,node-2", "--network", "private", GOOD],
     "--network applies to the local engine only"),
    ("no-doctor-on-pernode", ["--hosts", "node-1,node-2", "--node-rank", "0", "--no-doctor",
                              GOOD], "runs on the pernode engine"),
    # ---- mistakes a newcomer makes: each named, with tfrun's way
    ("notebook", [*W2, "train.ipynb"], "jupyter nbconvert --to script train.ipynb"),
    ("python-missing", [*W2, "--python", "/nonexistent/python", GOOD],
     "--python /nonexistent/python is not an executable Python"),
    ("hosts-horovod-slots", ["--hosts", "localhost:4", GOOD], "looks like Horovod's host:slots"),
    ("misspelt-command", ["confg", "--workers", "2"], "Run 'tfrun config'"),
    ("torchrun-nproc", ["--nproc_per_node", "2", GOOD], "Use --workers N"),
    ("torchrun-master-addr", [*W2, "--master_addr=10.0.0.1", GOOD], "torchrun's flag"),
    ("torchrun-max-restarts", [*W2, "--max_restarts", "3", GOOD],
     "Use --max-restarts K (preemptions do not count)"),
    ("k8s-hosts", ["k8s", "--image", "i", "--hosts", "a,b", GOOD],
     "tfrun k8s places the tasks in pods"),
    ("horovod-np", ["-np", "2", GOOD], "horovodrun's flag"),
    ("horovod-H-after-a-flag", [*W2, "-H", "a:2,b:2", GOOD], "h1,h1,h2: not host:slots"),
    ("k8s-cpu-not-a-quantity", ["k8s", "--image", "i", "--cpu", "abc", GOOD],
     "--cpu 'abc' is not a Kubernetes quantity"),
    ("k8s-strategy-bogus", ["k8s", "--image", "i", "--strategy", "bogus", GOOD],
     "Unknown strategy 'bogus'"),
    ("k8s-check-bad-quantity", ["k8s", "--check", "bad-cpu.yaml"],
     "limits.cpu is not a Kubernetes quantity"),
    # ---- environment defaults
    ("env-max-restarts", ["--workers", "2", GOOD], "TFRUN_MAX_RESTARTS"),
]
_STEP = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "n[1-2]",
         "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURMD_NODENAME": "n1"}
ENV = {"env-max-restarts": {"TFRUN_MAX_RESTARTS": "lots"},
       "slurm-bad-nodelist": {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n[3-1]"},
       "slurm-two-per-node-srun": _STEP,
       # a 'ray' package that cannot be imported, as where Ray is not installed
       "ray-not-installed": {"PYTHONPATH": "noray", "PYTHONDONTWRITEBYTECODE": "1"}}
NEEDS_ROOT = {"run-dir-read-only", "run-dir-disk-full"}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """The directory every case runs in, with its fixtures (and two tiny mounts as root)."""
    root = tmp_path_factory.mktemp("bad-input")
    (root / GOOD).write_text("print('hello')\n")
    (root / "train.ipynb").write_text('{"cells": [], "nbformat": 4}\n')
    (root / "bad-cpu.yaml").write_text(_manifest_with_cpu("abc"))
    (root / "broken.py").write_text("x = 1\ndef f(:\n")
    (root / "nul.py").write_bytes(b"x = 1\x00\n")
    (root / "adir").mkdir()
    (root / "afile").write_text("not a directory\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("raise SystemExit('imported: the check must not')\n")
    (root / "pkg" / "broken.py").write_text("def f(:\n")
    (root / "done").mkdir()
    (root / "noray" / "ray").mkdir(parents=True)
    (root / "noray" / "ray" / "__init__.py").write_text("raise ImportError('no ray here')\n")
    (root / "done" / "summary.json").write_text("{}\n")
    (root / "busy" / ".tfrun").mkdir(parents=True)
    lock = os.open(root / "busy" / ".tfrun" / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    os.write(lock, b"4242")
    fcntl.flock(lock, fcntl.LOCK_EX)  # "another tfrun" holds it for the whole module
    mounts = []
    if os.geteuid() == 0:
        for name, options in (("ro", "ro,size=64k"), ("full", "size=16k")):
            (root / name).mkdir()
            subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(root / name)],
                           check=True)
            mounts.append(root / name)
        _fill(root / "full")
    try:
        yield root
    finally:
        os.close(lock)
        for mount in mounts:
            subprocess.run(["umount", str(mount)], check=False)


def _manifest_with_cpu(cpu: str) -> str:
    """A tfrun k8s JobSet manifest whose CPU limit is ``cpu`` (as a hand edit would leave it)."""
    from tfrun.launch.engines.kubernetes import K8sJob, job_manifest, render_yaml

    manifest = job_manifest(K8sJob(name="j", image="i", command=(GOOD,), cpu="2"))
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"][0]["resources"]["limits"]["cpu"] = cpu
    return render_yaml(manifest)


def _fill(directory: Path) -> None:
    try:
        with open(directory / "filler", "wb") as f:
            while True:
                f.write(b"x" * 4096)
                f.flush()
    except OSError:
        pass
    for i in range(1000):  # inodes too: the run dir's mkdir must fail
        try:
            (directory / f"d{i}").mkdir()
        except OSError:
            break


def _snapshot(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if not str(p.relative_to(root)).startswith(("ro/", "full/"))}


@pytest.mark.parametrize("case_id, argv, named", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error_and_leaves_nothing(scratch, case_id, argv, named):
    if case_id in NEEDS_ROOT and os.geteuid() != 0:
        pytest.skip("needs root to mount a read-only / full tmpfs")
    before = _snapshot(scratch)
    env = {**os.environ, **ENV.get(case_id, {})}
    env.pop("TF_CONFIG", None)
    argv = [a if isinstance(a, bytes) else a.encode() for a in argv]
    proc = subprocess.Popen([sys.executable.encode(), b"-m", b"tfrun", *argv], cwd=scratch,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out, _ = proc.communicate(timeout=60)
    text = out.decode(errors="replace")
    assert proc.returncode == 2, text[-2000:]
    assert "Traceback" not in text, text[-3000:]
    assert named in text, f"the message does not name {named!r}:\n{text[-2000:]}"
    assert len([l for l in text.splitlines() if "error" in l.lower()]) <= 2, text[-2000:]
    assert _snapshot(scratch) == before, "files left behind"
    assert not (scratch / "runs").exists()
    for p in psutil.process_iter():
        try:
            assert p.environ().get("TFRUN_NETWORK_OF") != str(proc.pid), p.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass


def test_a_subcommand_s_help_is_its_own():
    out = subprocess.run([sys.executable, "-m", "tfrun", "doctor", "--help"], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("usage: tfrun doctor"), out.stdout[:500]
    assert "Check the hosts of an SSH launch" in out.stdout


def test_the_table_is_big_enough():
    assert len(CASES) >= 60
