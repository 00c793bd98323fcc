"""Log helpers: noise filter, traceback extraction, console filtering."""

import io

import pytest

from tfrun.launch.output import ConsoleSink, is_tf_noise, last_traceback, parse_task_filter


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


def test_tfrun_s_wrapper_frames_are_left_out_of_the_shown_traceback_but_a_raising_one_stays():
    """The root cause showed three tfrun frames (metrics.py fit, the compat fixes) between
    the script's model.fit and Keras in every script error; now a note stands for them. A
    frame of tfrun's that raised (a tfrun bug) is the evidence and stays, in every chain."""
    wrapped = ["Traceback (most recent call last):",
               '  File "/w/train.py", line 42, in <module>', "    model.fit(data)",
               '  File "/s/tfrun/in_task/measure/metrics.py", line 332, in fit',
               "    return fit_of(self)(x, y, **kwargs)", "           ^^^^^^^^^^^^",
               '  File "/s/tfrun/in_task/compat/keras3.py", line 441, in routed',
               "    return original(self, x, y)",
               '  File "/s/keras/src/utils/traceback_utils.py", line 122, in error_handler',
               "    raise e.with_traceback(filtered_tb) from None",
               '  File "/w/train.py", line 38, in on_epoch_end', "    raise RuntimeError('x')",
               "RuntimeError: x"]
    shown = last_traceback(wrapped).splitlines()
    assert not any("tfrun/in_task" in line for line in shown), shown
    assert shown[3] == ("  (2 frames of tfrun's wrappers left out here; the task's log "
                        "has them)")
    assert shown[-1] == "RuntimeError: x" and '  File "/w/train.py", line 38' in shown[-3]
    raising = ["Traceback (most recent call last):", '  File "/w/train.py", line 3, in <module>',
               '  File "/s/tfrun/in_task/compat/keras3.py", line 91, in <lambda>',
               "    device = value.device", "ValueError: no device",
               "", "During handling of the above exception, another exception occurred:", "",
               "Traceback (most recent call last):",
               '  File "/s/tfrun/in_task/measure/metrics.py", line 3, in fit',
               '  File "/w/train.py", line 9, in <module>', "KeyError: 'k'"]
    shown = last_traceback(raising)
    assert "keras3.py\", line 91" in shown and "metrics.py" not in shown, shown


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
    from tfrun.launch.output import NoiseFilter

    noise = NoiseFilter()
    lines = ["I0000 00:00:1795.2 29127 eager_service_impl.cc:355] SessionOptions: goo.gle/debugonly",
             "device_count {", '  key: "CPU"', "  value: 1", "}", "allow_soft_placement: true",
             "", "MirroredStrategy: 2 replicas", "accuracy: 0.95", "loss: 0.1"]
    assert [noise(l) for l in lines] == [True] * 7 + [False, False, False]


# --------------------------------------------------------------------------- issue 12.6, 12.7, 12.9

from tfrun.launch.output import NoiseFilter, OutputSplitter  # noqa: E402

KERAS_BAR = (b"Epoch 1/2\n\r\x1b[1m 1/8\x1b[0m loss: 0.9" + b"\x08" * 30 +
             b"\r\x1b[1m 4/8\x1b[0m loss: 0.7" + b"\x08" * 30 + b"\r\x1b[1m8/8\x1b[0m loss: 0.5\n")


@pytest.mark.parametrize("chunk", [len(KERAS_BAR), 1, 7, 40])
def test_splitter_gives_progress_as_it_comes_and_the_final_line(chunk):
    splitter, events = OutputSplitter(), []
    for i in range(0, len(KERAS_BAR), chunk):
        events += splitter.feed(KERAS_BAR[i:i + chunk])
    events += splitter.close()
    lines = [text for kind, text in events if kind == "line"]
    assert lines == ["Epoch 1/2", "\x1b[1m8/8\x1b[0m loss: 0.5"]
    progress = [text for kind, text in events if kind == "progress"]
    assert all("\r" not in p and "\x08" not in p for p in progress)
    if chunk < len(KERAS_BAR):  # read while the bar is drawn: its updates are shown
        assert any("4/8" in p for p in progress)
    else:  # all at once: only the line that ends it matters
        assert progress == []


def test_splitter_keeps_only_the_newest_redraw_and_flushes_endless_lines():
    splitter = OutputSplitter()
    for i in range(10_000):
        splitter.feed(f"\rstep {i}".encode())
    assert len(splitter._pending) < 100
    assert splitter.close() == [("line", "step 9999")]
    huge = OutputSplitter()
    events = huge.feed(b"x" * (OutputSplitter.MAX_PENDING + 1))
    assert events == [("line", "x" * (OutputSplitter.MAX_PENDING + 1))]


def test_live_console_draws_progress_under_the_lines_and_erases_it():
    out = io.StringIO()
    sink = ConsoleSink(out, color=False, live=True)
    sink.task_line("worker:0", 0, "Epoch 1/2")
    sink.task_progress("worker:0", 0, "\x1b[1m 1/8\x1b[0m loss: 0.9")
    sink.task_line("worker:1", 1, "a warning")       # goes above the bar, which is redrawn
    sink.task_line("worker:0", 0, " 8/8 loss: 0.5")   # ends the bar
    sink.info("run succeeded")
    assert out.getvalue() == ("[worker:0] Epoch 1/2\n"
                              "\r\x1b[K[worker:0]  1/8 loss: 0.9"
                              "\r\x1b[K[worker:1] a warning\n"
                              "\r\x1b[K[worker:0]  1/8 loss: 0.9"
                              "\r\x1b[K[worker:0]  8/8 loss: 0.5\n"
                              "tfrun: run succeeded\n")


def test_console_without_a_terminal_leaves_progress_out():
    out = io.StringIO()
    sink = ConsoleSink(out, color=False)
    sink.task_progress("worker:0", 0, " 1/8")
    sink.task_line("worker:0", 0, "\x1b[1m8/8\x1b[0m done")
    assert out.getvalue() == "[worker:0] 8/8 done\n"


TF_GRAPH_ERROR = """\
Traceback (most recent call last):
  File "/tmp/end_of_data.py", line 8, in <module>
    print(int(double_next(iterator)), flush=True)
  File "/usr/lib/python3.11/site-packages/tensorflow/python/eager/execute.py", line 59, in quick_execute
    except TypeError as e:
tensorflow.python.framework.errors_impl.OutOfRangeError: Graph execution error:

Detected at node IteratorGetNext defined at (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main

  File "/tmp/end_of_data.py", line 8, in <module>

  File "/tmp/end_of_data.py", line 6, in double_next

End of sequence
\t [[{{node IteratorGetNext}}]] [Op:__inference_double_next_12]
I0000 00:00:1795344978.9 18069 server.cc:1] shutting down
""".splitlines()


def test_last_traceback_keeps_tensorflows_message_after_the_exception_line():
    text = last_traceback(TF_GRAPH_ERROR)
    assert text.splitlines()[-2:] == ["End of sequence",
                                      "\t [[{{node IteratorGetNext}}]] [Op:__inference_double_next_12]"]
    assert "OutOfRangeError: Graph execution error:" in text
    # The "Detected at" frame list is cut to its last frame, and the log line is not kept.
    assert "Detected at node IteratorGetNext" in text and "_run_module_as_main" not in text
    assert '  File "/tmp/end_of_data.py", line 6, in double_next' in text
    assert "shutting down" not in text


def test_last_traceback_drops_frames_not_the_message_when_too_long():
    frames = [f'  File "f{i}.py", line {i}, in f' for i in range(200)]
    text = last_traceback(["Traceback (most recent call last):", *frames, "ValueError: the reason",
                           "more detail"], max_lines=20)
    lines = text.splitlines()
    assert len(lines) == 20 and lines[-2:] == ["ValueError: the reason", "more detail"]
    assert "frames left out" in text


def test_noise_filter_hides_continuations_of_hidden_log_lines_only():
    noise = NoiseFilter()
    verdicts = [noise(line) for line in [
        "I0000 00:00:1.0 1 coordination_service.cc:505] Example stragglers:",
        "/job:worker/replica:0/task:1",
        "W0000 00:00:1.0 1 type_inference.cc:3] Type inference failed.",
        "\twhile inferring type of node 'AutoShardDataset'",
        "/job:worker/replica:0/task:1 is my own print",
    ]]
    assert verdicts == [True, True, True, True, False]
    fresh = NoiseFilter()
    assert fresh("/job:worker/replica:0/task:1") is False  # not after a hidden line: shown


# TensorFlow's "a peer crashed" alarms, as a lingering worker logged them after its peer's
# (or the leader's) clean exit (tests/scripts/plain/late_exit.py).
_PEER_CRASHED = [
    "E0000 00:00:1795352796.291146   30023 base_collective_executor.cc:252] BaseCollectiveExecutor"
    "::StartAbort UNAVAILABLE: Error reported from /job:worker/task:1: The following tasks are "
    "unhealthy (stopped sending heartbeats):",
    "/job:worker/replica:0/task:1",
    "The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. "
    "preemption, eviction) to debug further. [type.googleapis.com/tensorflow.CoordinationServiceError"
    "='\\\"\\n\\n\\x06worker\\x10\\x01']",
]
_LEADER_GONE = [
    "E0000 00:00:1795352761.635042   29770 base_collective_executor.cc:252] BaseCollectiveExecutor"
    "::StartAbort UNAVAILABLE: Failed to send RPC to coordination service. Either the leader task "
    "was preempted/died/restarted unexpectedly or this task is experiencing network issues.",
    "Additional GRPC error information from remote target /job:worker/replica:0/task:0 while "
    "calling /tensorflow.CoordinationService/Heartbeat:",
    ':UNKNOWN:Error received from peer  {grpc_message:"failed to connect to all addresses", '
    "grpc_status:14}",
]


@pytest.mark.parametrize("alarm", [_PEER_CRASHED, _LEADER_GONE], ids=["peer", "leader"])
def test_peer_crash_alarm_is_hidden_only_after_a_clean_exit_of_a_peer(alarm):
    lines = [*alarm, "late_exit: worker 0 done"]
    after_clean_exit = NoiseFilter(lambda: True)
    assert [after_clean_exit(l) for l in lines] == [True] * len(alarm) + [False]
    # A peer failed (or none has left yet): the alarm is news, shown in full.
    for shown in (NoiseFilter(lambda: False), NoiseFilter()):
        assert [shown(l) for l in lines] == [False] * len(lines)


def test_peer_crash_alarm_continuations_stop_at_the_first_other_line():
    shown = NoiseFilter(lambda: True)
    lines = [_PEER_CRASHED[0], "Traceback (most recent call last):", "/job:worker/replica:0/task:1"]
    assert [shown(l) for l in lines] == [True, False, False]


def test_replaced_device_count_reads_the_task_warning():
    from tfrun.contract import DEVICES_REPLACED
    from tfrun.launch.output import replaced_device_count

    line = (f"/tmp/own.py:9: UserWarning: {DEVICES_REPLACED}3 logical CPU device(s) itself, "
            "replacing tfrun --devices 2: this task runs with 3.")
    assert replaced_device_count(line) == 3
    assert replaced_device_count("Epoch 3 logical CPU device(s)") is None


def test_live_console_keeps_a_status_line_under_the_bar_and_erases_both():
    out = io.StringIO()
    sink = ConsoleSink(out, color=False, live=True)
    sink.set_status("tfrun: 2/2 tasks up")
    sink.task_progress("worker:0", 0, " 1/8")
    sink.task_line("worker:0", 0, " 8/8 done")
    sink.end_progress()
    assert out.getvalue() == ("\r\x1b[Ktfrun: 2/2 tasks up"
                              "\r\x1b[K\r\x1b[K[worker:0]  1/8\ntfrun: 2/2 tasks up"
                              "\r\x1b[K\x1b[1A\r\x1b[K[worker:0]  8/8 done\n"
                              "\r\x1b[Ktfrun: 2/2 tasks up"
                              "\r\x1b[K")
    piped = ConsoleSink(io.StringIO(), color=False)
    piped.set_status("tfrun: 1/1 tasks up")  # no terminal: no status line
    assert piped.stream.getvalue() == ""


def test_with_a_lead_only_its_keras_progress_is_shown():
    out = io.StringIO()
    sink = ConsoleSink(out, color=False, live=True, lead="worker:0")
    for task in ("worker:0", "worker:1", "evaluator:0"):
        sink.task_progress(task, 0, " 1/8")
        sink.task_line(task, 0, "Epoch 1/2")
        sink.task_line(task, 0, " 8/8 ━━━━━━━━━━ 0s 3ms/step - loss: 0.5")
        sink.task_line(task, 0, f"{task} says hello")
    shown = [l.split("\r\x1b[K")[-1] for l in out.getvalue().split("\n")]
    assert "[worker:1] worker:1 says hello" in shown
    assert not any(l.startswith("[worker:1]") and "hello" not in l for l in shown), shown
    assert "[worker:0] Epoch 1/2" in shown and "[evaluator:0] Epoch 1/2" in shown


def test_splitter_takes_a_record_out_even_when_it_arrives_in_pieces():
    splitter = OutputSplitter()
    record = b'tfrun:metrics {"event": "resources", "rss_mb": 12.5}\n'
    events = []
    for piece in (b"\r 1/8", record[:10], record[10:30], record[30:], b"\r 2/8", b"\n"):
        events += splitter.feed(piece)
    assert ("metrics", '{"event": "resources", "rss_mb": 12.5}') in events
    assert [e for e in events if e[0] == "line"] == [("line", " 2/8")]
    assert all("tfrun:metrics" not in text for kind, text in events if kind != "metrics")
