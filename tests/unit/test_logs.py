"""Log helpers: noise filter, traceback extraction, console filtering."""

import io

import pytest

from tfrun.launch.logs import ConsoleSink, is_tf_noise, last_traceback, parse_task_filter


@pytest.mark.parametrize("line", [
    "2026-11-21 05:33:54.1: I tensorflow/core/util/port.cc:153] oneDNN custom operations are on. ...",
    "I0000 00:00:1795239234.920417    2276 cudart_stub.cc:31] Could not find cuda drivers on your machine",
    "E0000 00:00:1795239236.556475    2276 cuda_platform.cc:52] failed call to cuInit: INTERNAL",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "W0000 00:00:1795239236.5 2276 collective_ops.cc:1] some warning",
    "INFO:tensorflow:Collective all_reduce tensors: 6 all_reduces",
    "To enable the following instructions: AVX512F, in other operations, rebuild TensorFlow",
])
def test_tf_noise_is_recognised(line):
    assert is_tf_noise(line)


@pytest.mark.parametrize("line", [
    "Epoch 1/5", "test accuracy: 0.95", "Traceback (most recent call last):",
    "E0000 00:00:1795239236.5 2276 coordination_service.cc:1] Task /job:worker/task:1 heartbeat timeout",
    "ValueError: Attempt to convert a value (PerReplica...)",
])
def test_useful_lines_are_not_noise(line):
    assert not is_tf_noise(line)


def test_last_traceback_takes_the_last_one_with_its_exception():
    log = ["Traceback (most recent call last):", '  File "a.py", line 1', "KeyError: 'old'",
           "more output", "Traceback (most recent call last):", '  File "b.py", line 2, in f',
           "    g()", "ValueError: new", "I0000 00:00:1.0 1 x.cc:1] shutdown noise"]
    assert last_traceback(log) == ('Traceback (most recent call last):\n  File "b.py", line 2, in f\n'
                                   "    g()\nValueError: new")


def test_last_traceback_keeps_chained_exceptions():
    log = ["Traceback (most recent call last):", '  File "a.py", line 1', "KeyError: 'x'", "",
           "During handling of the above exception, another exception occurred:", "",
           "Traceback (most recent call last):", '  File "a.py", line 3', "RuntimeError: wrapped"]
    text = last_traceback(log)
    assert text.startswith("Traceback") and "KeyError: 'x'" in text and text.endswith("RuntimeError: wrapped")


def test_no_traceback():
    assert last_traceback(["all good", "bye"]) is None


def test_console_filter_by_role_and_task():
    out = io.StringIO()
    sink = ConsoleSink(out, color=False, show=parse_task_filter("chief,worker:1"))
    for task in ("chief:0", "worker:0", "worker:1", "ps:0"):
        sink.task_line(task, 0, f"from {task}")
    assert out.getvalue().splitlines() == ["[chief:0] from chief:0", "[worker:1] from worker:1"]
    assert parse_task_filter(None) is None and parse_task_filter("all") is None


def test_console_colour_only_when_asked():
    out = io.StringIO()
    ConsoleSink(out, color=True).task_line("worker:0", 1, "x")
    assert out.getvalue().startswith("\x1b[")
    out = io.StringIO()
    ConsoleSink(out).task_line("worker:0", 1, "x")  # StringIO is not a TTY
    assert out.getvalue() == "[worker:0] x\n"


def test_noise_filter_hides_proto_dumps_but_not_user_lines_that_look_alike():
    from tfrun.launch.logs import NoiseFilter

    noise = NoiseFilter()
    lines = ["I0000 00:00:1795.2 29127 eager_service_impl.cc:355] SessionOptions: goo.gle/debugonly",
             "device_count {", '  key: "CPU"', "  value: 1", "}", "allow_soft_placement: true",
             "", "MirroredStrategy: 2 replicas", "accuracy: 0.95", "loss: 0.1"]
    assert [noise(l) for l in lines] == [True] * 7 + [False, False, False]
