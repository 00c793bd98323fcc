"""Issue 12: every command the README and the docs show is run by a CI test.

The command lines are read from the code blocks of README.md and docs/*.md (the generated
command-line reference aside: its lines are argparse's help). Each is either run here, as
written (plus short step counts), or by the named test that runs its engine's commands
(multi-host fake hosts, Slurm, Ray, Kubernetes manifests), or by CI itself; the one that
cannot run on this machine says why. A command added to the README without a runner fails
this test.
"""

import json
import os
import re
import subprocess

import pytest

import warm_tasks
from conftest import REPORT_ON, ROOT

pytestmark = pytest.mark.tf

_COMMAND = re.compile(r"^(tfrun|python3?|srun|salloc|sbatch|kubectl)\s")
_COMMENT = re.compile(r"\s{2,}#.*$")


def readme_commands() -> list[str]:
    """Every command line of the README's and the docs' code blocks, in order, once each."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    commands, in_code = [], False
    for page in pages:
        if page.name in ("cli-reference.md", "benchmarks.md"):
            # the reference's usage lines are the parsers' own; the benchmarks' commands
            # reproduce measurements (minutes each, by hand), which tests never check
            continue
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                in_code = not in_code
                continue
            if in_code and _COMMAND.match(line):
                command = _COMMENT.sub("", line).strip()
                if command not in commands:
                    commands.append(command)
    return commands


# README line -> extra arguments for a short run (appended to the script's arguments).
RUN_HERE = {
    "tfrun --workers 2 examples/mnist_mlp.py": [],  # the main job, as written
    "tfrun --workers 2 train.py --epochs 3": [],
    "tfrun --chief --workers 2 --ps 1 train.py": [],
    "tfrun --devices 2 --strategy mirrored train.py": [],
    "tfrun --keras 2 --workers 2 train.py": [],
    "tfrun --workers 2 -m mypkg.train --lr 0.1": [],
    "tfrun --workers 2 --cpus-per-task 1 train.py": [],
    "tfrun --workers 2 --comm ring,pack=1MB train.py": [],
    "tfrun --workers 2 --evaluator examples/sidecar_evaluator.py": ["--epochs", "2"],
    "tfrun --chief --workers 2 --ps 1 examples/ps_training.py": ["--epochs", "2"],
    "tfrun --keras 2 --chief --workers 2 --ps 1 examples/ps_training.py": ["--epochs", "2"],
    "tfrun --layout uai --hosts localhost,localhost,localhost examples/ps_training.py": ["--epochs", "2"],
    "tfrun bench examples/mnist_mlp.py --workers 1,2": ["--epochs", "2"],
    "tfrun report runs/*-bench-mnist_mlp/workers-1 runs/*-bench-mnist_mlp/workers-2": [],
    "tfrun config --workers 2": [],
    "tfrun config --chief --workers 2 --ps 1 --evaluator": [],
    "tfrun config --hosts ip0,ip1,ip2,ip3 --layout uai --format env": [],
    'tfrun config --check "$TF_CONFIG"': [],
}
# README line -> the test file whose test runs it as written.
ELSEWHERE = {
    "tfrun --hosts node-1,node-2 examples/mnist_mlp.py": "tests/multihost/test_multihost.py",
    "tfrun --hosts node-1,node-2 --node-rank auto examples/mnist_mlp.py":
        "tests/multihost/test_multihost.py",
    "tfrun doctor --hosts node-1,node-2 examples/mnist_mlp.py":
        "tests/multihost/test_multihost.py",
    "tfrun bench --hosts node-1,node-2 --workers 1,2 --model mlp": "tests/multihost/test_multihost.py",
    # docs/elastic.md: the elastic tests run these with their own train.py (the step log)
    "tfrun --hosts node-1,node-2,node-3 --min-nodes 2 train.py": "tests/multihost/test_elastic_hosts.py",
    "tfrun --workers 2 --hosts node-1,node-2,node-3 --min-nodes 2 train.py":
        "tests/multihost/test_elastic_hosts.py",
    "tfrun --hosts node-1,node-2,node-3 --node-rank auto --min-nodes 2 train.py":
        "tests/multihost/test_elastic_hosts.py",
    "tfrun --workers 2 --hosts node-1,node-2,node-3 --node-rank auto --min-nodes 2 train.py":
        "tests/multihost/test_elastic_hosts.py",
    "tfrun slurm --nodes 2 --min-nodes 1 train.py > job.sh && sbatch job.sh":
        "tests/slurm/test_slurm.py",
    "tfrun --backend ray --workers 2 --min-nodes 1 train.py": "tests/ray/test_ray.py",
    "tfrun slurm --nodes 2 --time 10:00 examples/mnist_mlp.py > job.sh && sbatch job.sh":
        "tests/slurm/test_slurm.py",
    "srun --ntasks-per-node=1 tfrun examples/mnist_mlp.py": "tests/slurm/test_slurm.py",
    "salloc -N2 tfrun config --slurm": "tests/slurm/test_slurm.py",
    "tfrun --backend ray --workers 2 examples/mnist_mlp.py": "tests/ray/test_ray.py",
    "tfrun --backend ray --chief --workers 2 --ps 1 examples/ps_training.py --epochs 2": "tests/ray/test_ray.py",
    "tfrun k8s --image registry.example.com/train:1 --workers 2 examples/mnist_mlp.py > job.yaml":
        "tests/unit/test_k8s.py",
    "tfrun k8s --image registry.example.com/train:1 --workers 2 --run-volume runs train.py > job.yaml":
        "tests/unit/test_k8s.py",
}
BY_CI = ["python3 -m venv .venv && . .venv/bin/activate && python3 -m pip install -e '.[dev]'",
         "python3 -m pytest -m quick", "python3 -m pytest"]
_NO_CLUSTER = "no Kubernetes cluster here (docs/kubernetes.md says so)"
NOT_RUN = {"kubectl apply -f job.yaml":
           "no Kubernetes cluster here; tests/unit/test_k8s.py validates job.yaml against the "
           "JobSet CRD schema, as kubectl apply's server-side validation would",
           "kubectl describe jobset train": _NO_CLUSTER,
           "kubectl get pods -l jobset.sigs.k8s.io/jobset-name=train": _NO_CLUSTER,
           "kubectl logs -f train-worker-0-0-xxxxx": _NO_CLUSTER,
           "kubectl delete jobset train": _NO_CLUSTER}

# The user's train.py of the README's first examples: any topology, tfrun.fit.
TRAIN_PY = '''
import argparse
import numpy as np
import tensorflow as tf
import keras
import tfrun

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()
rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x.sum(axis=1) > 0).astype("int32")


def dataset_fn(ctx):
    ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(ctx.num_input_pipelines, ctx.input_pipeline_id)
    return ds.repeat().batch(ctx.get_per_replica_batch_size(64))


with tfrun.strategy().scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(args.lr), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
tfrun.fit(model, dataset_fn, epochs=args.epochs, steps_per_epoch=10)
print(f"train.py done: {type(tfrun.strategy()).__name__}", flush=True)
'''


def declared_readme_commands(test_file: str) -> list[str]:
    """The README_COMMAND(S) constants of a test module (which its README test runs)."""
    import ast

    found = []
    for node in ast.walk(ast.parse((ROOT / test_file).read_text())):
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id.startswith("README_COMMAND") for t in node.targets):
            value = ast.literal_eval(node.value)
            found += [value] if isinstance(value, str) else list(value)
    return found


def test_every_readme_command_has_a_runner():
    commands = readme_commands()
    assert len(commands) >= 25, commands  # the parser found the README's code blocks
    runners = set(RUN_HERE) | set(ELSEWHERE) | set(BY_CI) | set(NOT_RUN)
    assert [c for c in commands if c not in runners] == [], "README commands nobody runs"
    assert sorted(runners - set(commands)) == [], "runners of commands the README no longer shows"
    for command, test_file in ELSEWHERE.items():
        assert command in declared_readme_commands(test_file), f"{test_file} does not run {command!r}"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    # CI runs the README's set-up, then its test commands, in a brand-new environment.
    assert [line for line in ci if line in BY_CI] == BY_CI, ci
    assert ci.index("rm -rf .venv") < ci.index(BY_CI[0]), ci


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    work = tmp_path_factory.mktemp("readme")
    (work / "examples").symlink_to(ROOT / "examples")
    (work / "train.py").write_text(TRAIN_PY)
    (work / "mypkg").mkdir()
    (work / "mypkg" / "__init__.py").write_text("")
    (work / "mypkg" / "train.py").write_text(TRAIN_PY)
    return work


BENCH = "tfrun bench examples/mnist_mlp.py --workers 1,2"
#: The README's report line reads the bench's runs: the bench's test runs it after them
#: (a test of its own would run the bench again wherever the other worker of -n ran it).
REPORT = next(command for command in RUN_HERE if command.startswith("tfrun report"))


def run_readme_line(command: str, workdir):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CONFIG", "TF_USE_LEGACY_KERAS")}
    env.update(REPORT_ON)  # pages included, as a user gets them
    # The warm starters every local run of this worker uses (tf_keras' for --keras 2).
    env.update(warm_tasks.for_run(command.split(), env))
    run_dir = workdir / "runs" / re.sub(r"\W+", "-", command)
    if not command.startswith(("tfrun bench", "tfrun report")):  # bench names its own dirs
        env["TFRUN_RUN_DIR"] = str(run_dir)
    if "$TF_CONFIG" in command:  # a hand-written legacy TF_CONFIG, as a user would have
        env["TF_CONFIG"] = json.dumps({"cluster": {"master": ["h0:2222"], "worker": ["h1:2222"]},
                                       "task": {"type": "master", "index": 0}})
    line = " ".join([command, *RUN_HERE[command]])
    result = subprocess.run(["bash", "-c", line], cwd=workdir, env=env, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, f"{line}\n{result.stdout[-4000:]}\n{result.stderr[-2000:]}"
    return result, run_dir


def epochs_recorded(run_dir) -> dict[str, int]:
    """task file -> its epoch records in the run's metrics/ (what tfrun.in_task.measure.metrics wrote)."""
    return {p.stem: sum(json.loads(l)["event"] == "epoch" for l in p.read_text().splitlines())
            for p in sorted((run_dir / "metrics").glob("*.jsonl"))}


def check_bench_table(stdout: str, workdir) -> None:
    lines = stdout.splitlines()
    header = next(i for i, l in enumerate(lines) if l.startswith("configuration "))
    assert lines[header].split()[:4] == ["configuration", "workers", "status", "time"]
    assert "speedup" in lines[header] and "efficiency" in lines[header]
    rows = lines[header + 1:header + 3]
    assert [r.split()[:4] for r in rows] == [["1", "worker(s)", "1", "succeeded"],
                                             ["2", "worker(s)", "2", "succeeded"]], rows
    [bench_dir] = sorted(workdir.glob("runs/*-bench-mnist_mlp"))
    report = json.loads((bench_dir / "bench.json").read_text())
    assert [r["workers"] for r in report["runs"]] == [1, 2]
    assert [r["batch_size"] for r in report["runs"]] == [32, 64] and "weak" in report["scaling"]
    assert all(r["samples_per_s"] > 0 and r["epochs"] == 2 for r in report["runs"])
    assert report["runs"][0]["speedup"] == 1.0 and report["runs"][1]["efficiency"] > 0
    # Issue 15.2: the step breakdown; one worker has nothing to all-reduce, two do.
    one, two = (r["breakdown"] for r in report["runs"])
    assert one["allreduce_ms"] is None and one["step_ms"] > 0 and one["allreduce_bytes"] > 0
    assert two["allreduce_ms"] > 0 and two["allreduce_bytes"] == one["allreduce_bytes"]
    assert two["rest_ms"] == pytest.approx(two["step_ms"] - two["allreduce_ms"], abs=0.01)
    assert "all-reduce (ms)" in lines[header] and "rest (ms)" in lines[header]
    # Two workers on this host: through tfrun's shared memory (issue 15.3).
    assert one["allreduce_via"] is None and two["allreduce_via"] == "shared memory (native)"
    assert "all-reduce via" in lines[header] and "shared memory (native)" in rows[1]
    # Both workers' metrics are in the run dir (worker 1's output is no less recorded).
    assert epochs_recorded(bench_dir / "workers-2") == {"worker-0": 2, "worker-1": 2}
    # The same table as a page with the throughput chart (issue 15.1's plot).
    assert lines[-1].startswith("tfrun bench: page: ") and \
        lines[-1].endswith(f"{bench_dir.name}/bench.html"), lines[-3:]
    page = (bench_dir / "bench.html").read_text()
    assert "<h2>Throughput</h2>" in page and "data:image/png;base64," in page
    assert "workers-1" in page and "workers-2" in page


@pytest.mark.parametrize("command", sorted(set(RUN_HERE) - {REPORT}))
def test_readme_command_runs_as_written(command, workdir):
    result, run_dir = run_readme_line(command, workdir)
    if command == BENCH:
        check_bench_table(result.stdout, workdir)
        report, _ = run_readme_line(REPORT, workdir)
        rows = report.stdout.splitlines()
        assert rows[0].split()[:2] == ["run", "workers"] and "speedup" in rows[0]
        assert len(rows) == 4 and rows[1].split()[1] == "1" and rows[2].split()[1] == "2"
        # ... and the same table as a page.
        assert rows[3] == "tfrun: report: tfrun-report.html"
        page = (workdir / "tfrun-report.html").read_text()
        assert "speedup" in page and page.count("workers-1") >= 1 and page.count("workers-2") >= 1
    trains = ("train.py" in command or "examples/" in command) and "tfrun config" not in command
    if trains and not command.startswith(("tfrun bench", "tfrun report")):
        # Every training task's epochs are recorded, whatever the Keras flavour or strategy.
        recorded = epochs_recorded(run_dir)
        trainers = {"chief-0"} if "--ps" in command or "uai" in command else \
            {f"worker-{i}" for i in range(2 if "--workers 2" in command else 1)}
        if "--evaluator" in command:
            trainers = {"worker-0", "worker-1"}
        assert trainers <= set(recorded) and all(recorded[t] >= 1 for t in trainers), recorded
    if "train.py" in command:
        assert "train.py done:" in result.stdout
    if "--check" in command:
        assert '"chief"' in result.stdout and "master" not in result.stdout.split("cluster")[-1]
