"""tfrun.in_task.measure.metrics (task side) and the launcher's side of the records (TaskLogger, runstats,
tfrun bench's argument split). Pure: no TensorFlow process; Keras callbacks are driven by hand."""

import io
import json

import pytest

from tfrun.in_task.measure import metrics
from tfrun.contract import METRICS_LINE as METRICS
from tfrun.errors import ConfigError
from tfrun.cli.bench import parse_bench_argv, parse_sizes, scaling_note
from tfrun.launch.output import ConsoleSink, TaskLogger
from tfrun.launch.results.runstats import compare, format_table, read_run


@pytest.fixture
def recording(monkeypatch, tmp_path):
    monkeypatch.setenv("TFRUN_RUN_DIR", str(tmp_path))
    monkeypatch.delenv("TFRUN_METRICS", raising=False)


def records(text: str) -> list[dict]:
    return [json.loads(line[len(METRICS):]) for line in text.splitlines() if line.startswith(METRICS)]


class FakeCallback:  # the shape of keras.callbacks.Callback that the recorder relies on
    def __init__(self):
        self.params = {}


def test_log_metrics_prints_one_record_under_tfrun_and_nothing_outside(recording, capsys, monkeypatch):
    metrics.log_metrics(step=7, loss=0.5, note="text", nan=float("nan"))
    [record] = records(capsys.readouterr().out)
    assert record["event"] == "log" and record["step"] == 7 and record["values"] == {"loss": 0.5}
    monkeypatch.setenv("TFRUN_METRICS", "0")
    metrics.log_metrics(loss=1.0)
    monkeypatch.delenv("TFRUN_METRICS")
    monkeypatch.delenv("TFRUN_RUN_DIR")
    metrics.log_metrics(loss=1.0)
    assert capsys.readouterr().out == ""


def test_the_recorder_times_epochs_and_prints_each_at_the_next_clean_point(recording, capsys):
    [recorder] = metrics.with_recorder(None, FakeCallback, batch_size=64)
    recorder.params = {"steps": 4}
    recorder.on_train_begin()
    recorder.on_epoch_begin(0)
    for batch in range(4):
        recorder.on_train_batch_end(batch)
    logs = {"loss": 0.75}
    recorder.on_epoch_end(0, logs)
    logs["accuracy"] = 0.5  # a later callback adds to the epoch's logs: still recorded
    # Not yet: Keras' progress bar ends its line after the callbacks' on_epoch_end.
    assert records(capsys.readouterr().out) == []
    recorder.on_epoch_begin(1)
    [first] = records(capsys.readouterr().out)
    recorder.on_train_batch_end(0)
    recorder.on_epoch_end(1, {"loss": 0.5})
    recorder.on_train_end()
    [second] = records(capsys.readouterr().out)
    assert first["event"] == "epoch" and first["epoch"] == 1 and first["steps"] == 4
    assert first["logs"] == {"loss": 0.75, "accuracy": 0.5} and first["batch_size"] == 64
    assert first["steps_per_s"] > 0 and first["steady_steps_per_s"] > 0
    assert first["samples_per_s"] == pytest.approx(first["steady_steps_per_s"] * 64, rel=0.01)
    assert first["first_step_s"] > 0 and "first_step_s" not in second
    # One batch: no steady rate; the epoch's own rate stands in for samples/s.
    assert second["epoch"] == 2 and second["steady_steps_per_s"] is None
    assert second["samples_per_s"] == pytest.approx(second["steps_per_s"] * 64, rel=0.01)


def test_an_epoch_only_recorder_has_no_batch_hook_and_counts_the_fit_steps(recording, capsys):
    [recorder] = metrics.with_recorder([], FakeCallback, epoch_only=True)
    assert "on_train_batch_end" not in type(recorder).__dict__  # PS: tf_keras refuses batch hooks
    recorder.params = {"steps": 40}
    recorder.on_train_begin()
    recorder.on_epoch_begin(0)
    recorder.on_epoch_end(0, {"loss": 1.0})
    recorder.on_train_end()
    [record] = records(capsys.readouterr().out)
    assert record["steps"] == 40 and record["batch_size"] is None and record["samples_per_s"] is None


def test_with_recorder_adds_one_recorder_last_and_none_when_off(recording, monkeypatch):
    user = FakeCallback()
    once = metrics.with_recorder([user], FakeCallback)
    assert once[1] is user and len(once) == 2 and once[0]._tfrun_recorder
    assert metrics.with_recorder(once, FakeCallback) == once  # tfrun.fit inside model.fit
    monkeypatch.setenv("TFRUN_METRICS", "0")
    assert metrics.with_recorder([user], FakeCallback) == [user]


def test_batch_size_of_arrays_and_unknowns():
    import numpy as np

    assert metrics.batch_size_of(np.zeros((10, 3)), 16) == 16
    assert metrics.batch_size_of(np.zeros((10, 3))) == 32  # Keras' default
    assert metrics.batch_size_of([np.zeros((10, 3)), np.zeros((10, 1))], 8) == 8
    assert metrics.batch_size_of(lambda ctx: None) is None


def test_batch_size_of_datasets_walks_back_to_the_batch():
    tf = pytest.importorskip("tensorflow")
    data = tf.data.Dataset.range(100)
    assert metrics.batch_size_of(data.batch(24).map(lambda x: x * 2).prefetch(2).repeat()) == 24
    assert metrics.batch_size_of(data.batch(10, drop_remainder=True)) == 10
    assert metrics.batch_size_of(data) is None  # not batched: no batch size to report


def logger_with(tmp_path, out):
    return TaskLogger("worker:0", 0, tmp_path / "logs" / "worker-0.log",
                      ConsoleSink(out, color=False, live=False),
                      metrics_path=tmp_path / "metrics" / "worker-0.jsonl")


def test_the_task_logger_moves_records_to_the_metrics_file_and_off_the_console(tmp_path):
    out = io.StringIO()
    logger = logger_with(tmp_path, out)
    record = {"event": "epoch", "epoch": 1, "logs": {"loss": 0.5}}
    resources = {"event": "resources", "cpu_percent": 150.0}
    chunks = [b"Epoch 1/1\n" + f"{METRICS}{json.dumps(record)}\n".encode(),
              # a sampler thread's record in the middle of a progress line, cut in two reads
              b"\r 3/8 loss: 0.9" + f"{METRICS}{json.dumps(resources)}"[:20].encode(),
              f"{METRICS}{json.dumps(resources)}"[20:].encode() + b"\n\r 8/8 loss: 0.5\n",
              f"{METRICS}not json\n".encode() + b"done\n"]
    logger.pump(io.BufferedReader(io.BytesIO(b"".join(chunks)), buffer_size=8)).join(5)
    # The bar's line is intact: the record inside it never reaches the console.
    assert out.getvalue().splitlines() == ["[worker:0] Epoch 1/1", "[worker:0]  8/8 loss: 0.5",
                                           f"[worker:0] {METRICS}not json", "[worker:0] done"]
    saved = [json.loads(l) for l in (tmp_path / "metrics" / "worker-0.jsonl").read_text().splitlines()]
    assert saved == [{"task": "worker:0", **record}, {"task": "worker:0", **resources}]
    assert logger.last_epoch == {"task": "worker:0", **record}
    # The log keeps what the task printed, as it came, without the records (one inside a
    # line had split it there); what is no record stays.
    assert (tmp_path / "logs" / "worker-0.log").read_bytes() == (
        b"Epoch 1/1\n\r 3/8 loss: 0.9\r 8/8 loss: 0.5\n" + f"{METRICS}not json\n".encode()
        + b"done\n")


def test_resource_samples_are_no_progress_for_the_hang_watchdog(tmp_path, monkeypatch):
    clock = iter(range(100, 200))
    monkeypatch.setattr("tfrun.launch.output.tasklog.time.monotonic", lambda: float(next(clock)))
    logger = logger_with(tmp_path, io.StringIO())
    resources = f"{METRICS}{json.dumps({'event': 'resources', 'cpu_percent': 1.0})}\n".encode()
    logger.pump(io.BufferedReader(io.BytesIO(b"joined\n" + resources * 3))).join(5)
    after_line = logger.last_line_at
    assert after_line == 101.0  # pump's start is 100, the line 101; three samples: nothing
    epoch = f"{METRICS}{json.dumps({'event': 'epoch', 'epoch': 1, 'logs': {}})}\n".encode()
    logger.pump(io.BufferedReader(io.BytesIO(resources + epoch))).join(5)
    assert logger.last_line_at > after_line + 1  # an epoch is progress (after pump's restart)
    assert len((tmp_path / "metrics" / "worker-0.jsonl").read_text().splitlines()) == 5


# --------------------------------------------------------------------------- runstats


def fake_run(root, name, *, workers, batch, rates, status="succeeded", seconds=10.0):
    run = root / name
    (run / "metrics").mkdir(parents=True)
    tasks = [{"task": f"worker:{i}", "role": "worker", "index": i} for i in range(workers)]
    (run / "summary.json").write_text(json.dumps({"status": status, "started_at": 100.0,
                                                  "ended_at": 100.0 + seconds, "tasks": tasks}))
    lines = [json.dumps({"task": "worker:0", "event": "epoch", "epoch": i + 1, "batch_size": batch,
                         "steady_steps_per_s": r, "steps_per_s": r / 2, "logs": {"loss": 1.0 / (i + 1)},
                         **({"first_step_s": 3.5} if i == 0 else {})})
             for i, r in enumerate(rates)]
    (run / "metrics" / "worker-0.jsonl").write_text("\n".join(lines) + "\n{cut")
    (run / "metrics" / "worker-1.jsonl").write_text("")
    return run


def test_read_run_takes_worker_0_and_leaves_the_first_epoch_out(tmp_path):
    stats = read_run(fake_run(tmp_path, "a", workers=2, batch=64, rates=[1.0, 10.0, 12.0, 11.0]))
    assert (stats.workers, stats.seconds, stats.first_step_s, stats.epochs) == (2, 10.0, 3.5, 4)
    assert stats.steps_per_s == 11.0 and stats.samples_per_s == 704.0 and stats.batch_size == 64
    assert stats.final == {"loss": 0.25} and stats.task == "worker:0"


def test_compare_gives_speedup_and_efficiency_against_the_first_run(tmp_path):
    one = read_run(fake_run(tmp_path, "one", workers=1, batch=32, rates=[10.0, 10.0]))
    two = read_run(fake_run(tmp_path, "two", workers=2, batch=64, rates=[8.0, 8.0]))
    rows = compare([one, two])
    assert rows[1]["speedup"] == 1.6 and rows[1]["efficiency"] == 0.8
    assert rows[1]["speedup_by"] == "samples_per_s" and rows[0]["speedup"] == 1.0
    table = format_table(rows).splitlines()
    assert table[0].split()[:3] == ["run", "workers", "status"] and len(table) == 3
    assert "1.60" in table[2] and "0.80" in table[2]


def test_the_step_breakdown_is_read_and_gets_columns_only_when_a_run_has_one(tmp_path):
    one = fake_run(tmp_path, "one", workers=1, batch=32, rates=[10.0, 10.0])
    two = fake_run(tmp_path, "two", workers=2, batch=64, rates=[8.0, 8.0])
    plain = format_table(compare([read_run(one), read_run(two)])).splitlines()[0]
    assert "all-reduce" not in plain and "step (ms)" not in plain
    record = {"task": "worker:0", "event": "breakdown", "replicas": 2, "step_ms": 125.0,
              "allreduce_ms": 50.0, "allreduce_bytes": 7_760_000, "rest_ms": 75.0, "input_ms": None}
    with open(two / "metrics" / "worker-0.jsonl", "r+") as f:  # before the cut last line
        text = f.read().rsplit("\n", 1)
        f.seek(0)
        f.write(text[0] + "\n" + json.dumps(record) + "\n" + text[1])
    stats = read_run(two)
    assert stats.breakdown == {"step_ms": 125.0, "allreduce_ms": 50.0, "allreduce_bytes": 7_760_000,
                               "rest_ms": 75.0, "input_ms": None}
    assert stats.epochs == 2  # the breakdown is not an epoch
    table = format_table(compare([read_run(one), stats])).splitlines()
    header = table[0]
    assert "step (ms)" in header and "rest (ms)" in header and "all-reduce (ms)" in header
    assert "input (ms)" not in header  # no run measured it
    assert table[1].split()[11:14] == ["-", "-", "-"]  # after goodput, steps redone
    assert table[2].split()[11:14] == ["125.00", "75.00", "50.00"]


def test_a_run_without_metrics_still_compares_by_time_fields(tmp_path):
    run = tmp_path / "bare"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "failed", "tasks": []}))
    stats = read_run(run)
    assert stats.steps_per_s is None and stats.epochs == 0
    assert "-" in format_table(compare([stats]))


def test_read_run_of_a_directory_that_is_not_a_run_says_so(tmp_path):
    with pytest.raises(ConfigError, match="is not a finished tfrun run") as info:
        read_run(tmp_path)
    assert str(tmp_path) in str(info.value)


# --------------------------------------------------------------------------- tfrun bench


def test_bench_takes_its_own_flags_anywhere_and_leaves_the_rest_to_tfrun():
    plan = parse_bench_argv(["--chief", "--max-restarts", "2", "train.py", "--epochs", "3",
                             "--workers", "1,2", "--strong", "--", "--workers", "9"])
    assert plan.sizes == (1, 2) and plan.strong and plan.model is None
    assert plan.launch_argv == ("--chief", "--max-restarts", "2", "train.py", "--epochs", "3",
                                "--workers", "9")  # after --: the script's own --workers


def test_bench_model_runs_the_built_in_module():
    plan = parse_bench_argv(["--model", "cnn", "--devices", "2", "--", "--steps", "5"])
    assert plan.launch_argv == ("--devices", "2", "-m", "tfrun.in_task._bench_model", "--model", "cnn",
                                "--steps", "5")
    assert plan.sizes == (1, 2)  # the default


@pytest.mark.parametrize("argv, message", [
    (["train.py", "--workers", "1,1"], "is not a new size"),
    (["train.py", "--workers", "0,2"], "is not a new size"),
    (["train.py", "--workers"], "needs a value"),
    (["--model", "resnet"], "is not a built-in model"),
    (["--model", "mlp", "train.py"], "both --model and a script"),
    ([], "needs a script"),
    (["--run-dir", "x", "train.py"], "--run-dir cannot be used here"),
    (["--node-rank", "0", "--hosts", "a,b", "train.py"], "--node-rank cannot be used here"),
    (["--hosts"], "needs a value"),
])
def test_bench_refuses_bad_arguments_by_name(argv, message):
    with pytest.raises(ConfigError, match=message):
        parse_bench_argv(argv)


def test_bench_hosts_are_dealt_to_every_size_in_turn():
    plan = parse_bench_argv(["--hosts", "node-1, node-2", "--workers", "1,2,3", "--model", "mlp"])
    assert plan.hosts == ("node-1", "node-2") and "--hosts" not in plan.launch_argv
    assert [plan.hosts_for(n) for n in plan.sizes] == [
        ("node-1",), ("node-1", "node-2"), ("node-1", "node-2", "node-1")]
    assert parse_bench_argv(["train.py"]).hosts_for(2) == ()  # no --hosts: a local run
    with pytest.raises(ConfigError, match="run tfrun bench on one of them with --hosts"):
        parse_bench_argv(["--node-rank", "auto", "train.py"])


def test_sizes_and_scaling_note():
    assert parse_sizes("1,2,4") == (1, 2, 4)
    assert "strong scaling" in scaling_note([{"batch_size": 64}, {"batch_size": 64}], True)
    assert "unknown" in scaling_note([{"batch_size": None}, {"batch_size": 64}], False)


def test_sample_resources_covers_the_whole_process_tree():
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "x = bytearray(64 << 20); import time; time.sleep(30)"])
    try:
        import time

        time.sleep(1.0)
        alone = metrics.sample_resources(__import__("psutil").Process(child.pid))
        tree = metrics.sample_resources()
        assert alone["rss_mb"] >= 64 and tree["rss_mb"] >= alone["rss_mb"]  # child counted
        assert tree["threads"] >= 2 and tree["event"] == "resources"
    finally:
        child.kill()
        child.wait()


def test_a_task_shorter_than_one_sample_interval_still_sends_one_sample_as_it_exits(tmp_path):
    """A forked task can train and end within the first interval; its report still has its
    CPU and memory: one last sample is taken at exit."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TFRUN_RUN_DIR": str(tmp_path), "TFRUN_METRICS_INTERVAL": "60"}
    env.pop("TFRUN_METRICS", None)
    out = subprocess.run([sys.executable, "-c", "from tfrun.in_task.measure import metrics\n"
                          "metrics.install()\nmetrics.note_step(7)\nprint('done', flush=True)"],
                         env=env, capture_output=True, text=True, timeout=60, check=True).stdout
    samples = [r for r in records(out) if r["event"] == "resources"]
    assert len(samples) == 1, out
    assert samples[0]["step"] == 7 and samples[0]["rss_mb"] > 0
    assert out.index("done") < out.index(METRICS)  # taken at the end, not at the start


class _Denied:
    """A process whose /proc reads are denied, as under a hardened /proc or a container
    runtime that refuses them (psutil raises AccessDenied)."""

    pid = 4242

    def __init__(self):
        import psutil

        self.error = psutil.AccessDenied(self.pid)

    def children(self, recursive=False):
        raise self.error

    def oneshot(self):
        raise self.error


class _Fails:
    #: a CPU meter knows its CPUs (the task's affinity) even where /proc/stat is denied
    cpus = frozenset({1, 0})

    def __init__(self, exc):
        self.exc = exc

    def taken(self, own_cores):
        raise self.exc

    def seconds(self, pids):
        raise self.exc


def test_a_sample_whose_measurements_are_denied_still_carries_the_progress(capsys):
    """The sampler's progress never depends on its measurements: each denied one is left
    out and named (``unmeasured``), said once on stderr, and the samples go on."""
    from tfrun.in_task.measure import progress

    progress.reset()
    progress.step_began()
    progress.step_ended()
    measurements = metrics._Measurements()
    first = measurements.sample(_Denied(), _Fails(OSError("no /proc/stat")),
                                _Fails(PermissionError("schedstat")))
    second = measurements.sample(_Denied(), _Fails(OSError("no /proc/stat")),
                                 _Fails(PermissionError("schedstat")))
    progress.reset()
    for sample in (first, second):
        assert sample.steps_done == 1 and sample.doing == progress.BETWEEN_STEPS
        assert sample.cpu_percent is None and sample.rss_mb is None and sample.cpu_taken is None
        assert sample.unmeasured == ("cpu and memory", "cpu wait") and sample.cpus == (0, 1)
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and all("could not be measured" in line for line in said), said
    assert "AccessDenied" in said[0] and "its progress is still reported" in said[0]


def test_the_task_logger_reads_a_sample_without_measurements_as_progress(tmp_path):
    """A sample that lacks its measurements is still the task's progress for the hang
    clock; the launcher keeps what was not measured for the summary."""
    from tfrun.records import TaskSample

    logger = TaskLogger("worker:0", 0, tmp_path / "w.log",
                        ConsoleSink(io.StringIO(), color=False, live=False))
    for steps in (5, 9):
        sample = TaskSample(time=float(steps), steps_done=steps, doing="in a training step",
                            exchanges_entered=steps, exchanges_left=steps, exchange_seconds=0.1,
                            unmeasured=("cpu and memory",))
        logger._record_metrics(json.dumps(sample.to_record()))
    assert logger.progress[1:] == (9, "in a training step") and logger.advanced_at is not None
    assert [s.steps_done for s in logger.work] == [5, 9]
    assert logger.unmeasured == ("cpu and memory",) and not logger.cpu_taken


def test_a_fast_job_asks_for_a_sample_every_few_steps_but_not_sooner_than_the_floor(
        monkeypatch):
    """The straggler finder's evidence is counted in steps: steps of 10 ms ask for a sample
    every 0.2 s (not 2 s, when 200 steps are over); slower steps every 5 steps; a sample
    taken meanwhile (the interval's) starts the count again."""
    from tfrun.in_task.measure import progress

    clock = [0.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    woken = []
    progress.reset()

    def sample_now():  # the sampler, woken, takes its sample at once (and notes it)
        woken.append(progress.snapshot()["steps_done"])
        progress.sampled(woken[-1])

    progress.sample_when_due(sample_now)
    try:
        def steps(count, seconds_each):
            for _ in range(count):
                clock[0] += seconds_each
                progress.step_began()
                progress.step_ended()

        steps(40, 0.01)       # 10 ms steps: one sample per 0.2 s, 20 steps
        assert woken == [20, 40], woken
        steps(10, 0.5)        # 0.5 s steps: every 5 steps
        assert woken[2:] == [45, 50], woken
        steps(2, 0.5)
        woken.clear()
        progress.sampled(52)  # the interval's sample at step 52 (the sampler notes it) ...
        steps(5, 0.5)         # ... so the next is due at 57, not at 55
        assert woken == [57], woken
    finally:
        progress.sample_when_due(None)
        progress.reset()
