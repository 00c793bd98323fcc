"""Issue 15.3/15.4 with real TensorFlow tasks: --comm reaches MultiWorkerMirroredStrategy
(made plainly and by tfrun.strategy()), and local tasks get their own CPUs and GPUs.

No GPU here: the GPU list is faked the way a user restricts it (CUDA_VISIBLE_DEVICES in
tfrun's environment); what is checked is what each task was given."""

import json
import os

import pytest

from conftest import ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf
SCRIPTS = ROOT / "tests" / "scripts"


def probes(run: Run, prefix: str) -> dict[str, dict]:
    out = {}
    for line in run.stdout.splitlines():
        if f"] {prefix}: {{" in line:
            task = line[1:line.index("]")]
            out[task] = json.loads(line.split(f"{prefix}: ", 1)[1])
    return out


def test_comm_options_reach_plain_and_tfrun_made_strategies(tmp_path):
    run = Run(tmp_path, ["--workers", "2", "--comm", "ring,pack=1MB,timeout=90",
                         str(SCRIPTS / "comm_probe.py")])
    assert run.run(300) == 0, run.stdout[-3000:]
    got = probes(run, "comm_probe")
    assert {t: g["made_by"] for t, g in got.items()} == {"worker:0": "plain",
                                                          "worker:1": "tfrun.strategy()"}
    for options in got.values():
        assert (options["implementation"], options["bytes_per_pack"],
                options["timeout_seconds"]) == ("RING", 1 << 20, 90.0)
    assert run.stdout.count("comm_probe: all-reduce sum 2") == 2
    assert "comm       : ring,pack=1048576,timeout=90" in run.stdout
    # ring asks for TensorFlow's collectives: tfrun's shared-memory exchange stays out.
    assert SHM_LINE not in task_logs(run)


SHM_LINE = "tfrun: all-reduce through shared memory: "


def task_logs(run: Run) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((run.run_dir / "logs").glob("*.log")))


@pytest.mark.parametrize("flags, tasks, env, path", [
    (["--workers", "2"], ("worker:0", "worker:1"), {}, "(native exchange;"),
    (["--chief", "--workers", "1", "--comm", "shm,timeout=60"], ("chief:0", "worker:0"), {},
     "(native exchange;"),
    (["--workers", "2"], ("worker:0", "worker:1"), {"TFRUN_SHM_KERNEL": "0"},
     "(Python exchange, the native one is unavailable: TFRUN_SHM_KERNEL=0;"),
    (["--workers", "2", "--comm", "overlap=on"], ("worker:0", "worker:1"), {},
     "(native exchange, gradients in buckets overlapping backprop;"),
], ids=["default", "shm", "python-exchange", "overlap"])
def test_workers_on_one_host_all_reduce_through_shared_memory(tmp_path, flags, tasks, env, path):
    """Default (and --comm shm): the strategy's all-reduces, made plainly or by
    tfrun.strategy(), go through tfrun's exchange (native, or Python when turned off),
    which TensorFlow's own options still describe as AUTO; the sum is right. A pack of
    values in a graph (as gradients are) goes to the native op as it is, one exchange and
    no concat/split; the Python exchange keeps TensorFlow's concat. With overlap=on the
    pack goes to the exchange thread in buckets instead: neither op nor concat. (Training
    through it: test_keras_exactness.py.)"""
    run = Run(tmp_path, [*flags, str(SCRIPTS / "comm_probe.py")], env=env)
    assert run.run(300) == 0, run.stdout[-3000:]
    got = probes(run, "comm_probe")
    assert {t: g["implementation"] for t, g in got.items()} == dict.fromkeys(tasks, "AUTO")
    assert run.stdout.count("comm_probe: all-reduce sum 2") == 2
    packs = probes(run, "comm_probe_pack")
    native, op = path.startswith("(native"), path.startswith("(native exchange;")
    assert packs == dict.fromkeys(tasks, {
        "sums": [[2.0], [4.0], [6.0]], "shapes": [[3, 2], [5], [2, 2, 2]], "concat": not native,
        "native_exchange_inputs": [3] if op else []}), packs
    logs = task_logs(run)
    assert logs.count(SHM_LINE + "2 workers on this host") == 1, logs[-3000:]  # rank 0 says it
    assert logs.count(SHM_LINE + "2 workers on this host " + path) == 1, logs[-3000:]
    assert_nothing_left(run)


def test_a_worker_that_dies_mid_training_is_blamed_and_nothing_is_left(tmp_path):
    """Through shared memory (the default here). worker:0 either sees worker:1's socket
    close at its next all-reduce and fails naming it, or tfrun stops it first (the
    supervisor usually wins the race on one host): either way worker:1 is the root cause.
    The exchange-level failure itself: tests/unit/test_shm_allreduce.py."""
    run = Run(tmp_path, ["--workers", "2", "--stop-grace", "5",
                         str(SCRIPTS / "die_mid_training.py")])
    assert run.run(300) == 3, run.stdout[-3000:]  # the root cause's exit code
    root = run.summary["root_cause"]
    assert root["task"] == "worker:1" and root["exit_code"] == 3, root
    logs = task_logs(run)
    assert "die_mid_training: worker:1 exits now" in logs and SHM_LINE in logs
    worker_0 = run.tasks()["worker:0"]["state"]
    assert worker_0 in ("failed", "stopped"), worker_0
    if worker_0 == "failed":
        assert "tfrun shared-memory all-reduce: worker:1 left the exchange" in logs
    assert_nothing_left(run)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs to give 1 to each of 2 tasks")
def test_each_worker_gets_its_own_cpu_and_gpu(tmp_path):
    run = Run(tmp_path, ["--workers", "2", "--cpus-per-task", "1", str(SCRIPTS / "device_probe.py")],
              env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert run.run(300) == 0, run.stdout[-3000:]
    got = probes(run, "device_probe")
    cpus = sorted(os.sched_getaffinity(0))[:2]
    for index in (0, 1):
        task = got[f"worker:{index}"]
        # Every thread TensorFlow made runs on the task's one CPU.
        assert task["affinity"] == [cpus[index]]
        assert task["thread_affinities"] == [[cpus[index]]]
        assert task["cuda_visible_devices"] == str(index)  # default: one GPU per worker
    assert (f"placement  : worker:0 GPU 0 CPU {cpus[0]}, worker:1 GPU 1 CPU {cpus[1]}"
            in run.stdout)


def test_ps_cluster_gpus_go_to_workers_only(tmp_path):
    run = Run(tmp_path, ["--chief", "--workers", "2", "--ps", "1", "--roles", "script",
                         "--gpus-per-task", "2", str(SCRIPTS / "device_probe.py")],
              env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert run.run(300) == 0, run.stdout[-3000:]
    got = {t: p["cuda_visible_devices"] for t, p in probes(run, "device_probe").items()}
    assert got == {"chief:0": "", "worker:0": "0,1", "worker:1": "2,3", "ps:0": ""}
    all_cpus = sorted(os.sched_getaffinity(0))
    assert all(p["affinity"] == all_cpus for p in probes(run, "device_probe").values())


@pytest.mark.parametrize("flags, named", [
    (["--gpus-per-task", "3"], "--gpus-per-task 3 for 2 task(s) that train needs 6 GPUs"),
    (["--cpus-per-task", "64"], "--cpus-per-task 64 for 2 task(s) needs 128 CPUs"),
])
def test_too_few_devices_fails_before_anything_starts(tmp_path, flags, named):
    run = Run(tmp_path, ["--workers", "2", *flags, str(SCRIPTS / "device_probe.py")],
              env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})
    assert run.run(60) == 2
    assert named in run.stdout and "Fix:" in run.stdout
    assert not run.run_dir.exists()  # no run dir, no task, no port
    assert_nothing_left(run)


def test_mmap_threshold_keeps_matmul_buffers_off_fresh_mmaps(tmp_path):
    """tfrun.in_task.start.heap with real TensorFlow: after a tf.distribute dataset is read (TensorFlow pins
    glibc's mmap threshold at 128 KiB then), tfrun's default gives MatMuls their buffers back
    from the heap; ``--mmap-threshold tf`` keeps TensorFlow's pin, and each call page-faults
    its buffers in again (the probe's count, not a time: the effect on steps is measured by
    benchmarks/bench_strategy_overhead.py)."""
    faults = {}
    for flags in ([], ["--mmap-threshold", "tf"]):
        run = Run(tmp_path / (flags[-1] if flags else "default"),
                  ["--workers", "1", *flags, str(SCRIPTS / "heap_probe.py")])
        assert run.run(300) == 0, run.stdout[-3000:]
        faults[flags[-1] if flags else "default"] = probes(run, "heap_probe")["worker:0"]
        assert_nothing_left(run)
    assert faults["default"]["faults_per_call"] < 50 and faults["tf"]["faults_per_call"] > 500, faults
    # A 4 MiB buffer is 1,024 pages: faulted in at each use unless it stays on the heap and
    # the heap keeps it (tfrun also raises the trim threshold TensorFlow's pin left low). Under
    # TensorFlow's pin it is a fresh mmap each time -- asked of glibc, not counted in faults,
    # which transparent huge pages ('always') bring down to a handful.
    assert faults["default"]["faults_per_buffer"] < 50, faults
    assert not faults["default"]["buffer_is_a_fresh_mmap"], faults
    assert faults["tf"]["buffer_is_a_fresh_mmap"], faults
