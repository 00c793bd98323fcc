"""The hang clock and the culprit finder (launch.supervise.hang), the task side's progress
marks (in_task.measure.progress) and the launcher's reading of them (TaskLogger)."""

import io
import json
import time

import pytest

from tfrun.in_task.measure import progress
from tfrun.launch.output import ConsoleSink, TaskLogger
from tfrun.launch.supervise.hang import IN_STEP, HangClock, TaskProgress, blame, step_limit
from tfrun.launch.supervise.stacks import main_thread_first


def task(name, steps=30, doing=IN_STEP, sampled_at=99.0, advanced_at=20.0, step_s=0.1):
    return TaskProgress(name, "10.0.0." + name[-1], sampled_at, steps, doing,
                        advanced_at=advanced_at, seconds_per_step=step_s)


@pytest.mark.parametrize("tasks, culprits, why", [
    # a task stuck in its own callbacks while the other waits in the all-reduce
    ([task("worker:0"), task("worker:1", doing="callbacks")], ["worker:1"], "stuck in callbacks"),
    # a task whose samples stopped (SIGSTOP, or holding the GIL): first in evidence
    ([task("worker:0"), task("worker:1", sampled_at=50.0)], ["worker:1"],
     "sends no progress samples (its last came 50s ago)"),
    ([task("worker:0", doing="callbacks"), task("worker:1", sampled_at=None)], ["worker:1"],
     "never sent one"),
    # every task inside a step, one of them behind
    ([task("worker:0", steps=31), task("worker:1", steps=30), task("worker:2", steps=31)],
     ["worker:1"], "behind: 30 steps done"),
    # a task whose fit ended (fewer batches) while the other waits inside the next step
    ([task("worker:0", doing="after training"), task("worker:1")], ["worker:0"],
     "left training after 30 steps while worker:1 waits inside a step"),
    # a single worker: nothing to compare it with, it is the one
    ([task("worker:1")], ["worker:1"], "the only task training: stuck inside a training step"),
])
def test_the_culprit_is_named_by_evidence_and_the_others_wait_for_it(tasks, culprits, why):
    hang = HangClock().check(100.0, tasks)
    assert hang is not None and hang.limit == 60.0 and hang.idle == 80.0
    assert [c.task for c in hang.culprits] == culprits
    assert why in hang.culprits[0].why
    assert sorted(w.task for w in hang.waiting) == sorted(
        t.task for t in tasks if t.task not in culprits)
    assert all(f"for {', '.join(culprits)}" in w.why for w in hang.waiting)
    text = hang.describe()
    assert f"the culprit: {', '.join(culprits)}" in text and "(host 10.0.0.1" in text
    assert json.loads(json.dumps(hang.to_dict()))["culprits"][0]["task"] == culprits[0]


def test_no_culprit_when_none_stands_out():
    hang = HangClock().check(100.0, [task("worker:0"), task("worker:1")])
    assert hang is not None and hang.culprits == [] and hang.waiting == []
    assert "no task stands out" in hang.describe()


def test_the_clock_starts_at_the_first_step_and_honours_what_tasks_do():
    clock = HangClock()
    # No step yet and no formation time given: no clock.
    assert clock.check(1e6, [task("worker:0", steps=0, advanced_at=None, doing="setup")]) is None
    # A step within the limit.
    assert clock.check(79.0, [task("worker:0"), task("worker:1")]) is None
    # A backup (or evaluation) takes the phase limit: max(600 s, 10 x the step limit).
    saving = [task("worker:0", doing="the backup", sampled_at=599.0),
              task("worker:1", sampled_at=599.0)]
    assert clock.check(600.0, saving) is None
    late = clock.check(700.0, [task("worker:0", doing="the backup", sampled_at=699.0),
                               task("worker:1", sampled_at=699.0)])
    assert late is not None and late.limit == 600.0
    assert [c.task for c in late.culprits] == ["worker:0"]
    # Done with fit: the script's business; the clock stops when every task is.
    done = [task("worker:0", doing="after training"), task("worker:1", doing="after training")]
    assert clock.check(1e6, done) is None
    # --step-timeout off is no clock in the supervisor; a fixed one replaces the auto limit.
    assert HangClock(step_timeout=5.0).check(26.0, [task("worker:0")]).limit == 5.0


def test_before_the_first_step_the_phase_limit_counts_from_formation():
    """Issue 44.1: a task stuck before its first batch (its data, its strategy) while the
    other waits in the first step's collective was never a hang: the clock started at the
    first step. Now the phase limit counts from the cluster's formation."""
    stuck = [task("worker:0", steps=0, advanced_at=None, doing=IN_STEP, sampled_at=700.0),
             task("worker:1", steps=0, advanced_at=None, doing="setup", sampled_at=700.0)]
    clock = HangClock()
    assert clock.check(599.0, stuck, formed_at=0.0) is None  # tracing a big model: fine
    hang = clock.check(601.0, stuck, formed_at=0.0)
    assert hang is not None and hang.limit == 600.0 and hang.idle == 601.0
    assert [c.task for c in hang.culprits] == ["worker:1"]
    assert "stuck in setup" in hang.culprits[0].why
    assert [w.why for w in hang.waiting] == ["waiting in a training step for worker:1"]
    # --step-timeout 100: the phase limit, 10 x it, holds before the first step too.
    assert HangClock(step_timeout=100.0).check(999.0, stuck, formed_at=0.0) is None
    assert HangClock(step_timeout=100.0).check(1001.0, stuck, formed_at=0.0).limit == 1000.0
    # Once a step came, the step limit counts from it as before.
    assert clock.check(601.0, [task("worker:0", advanced_at=590.0)], formed_at=0.0) is None


def test_time_after_training_or_in_a_long_phase_counts_against_no_step_once_it_is_over():
    """CI's exactness run (keras 3, two workers) was called hung in the tracing of its third
    fit: the clock counted from the last step of the fit before, through an evaluate(), a
    predict() and the new model's build -- over 60 s on a loaded machine. The clock counts
    from the tasks' last move to another phase, and a fit's first step has the phase limit."""
    clock = HangClock()
    # Last step at 20.0; the tasks ran the script's own code after training until 500.0,
    # then began a new fit: its first step (tracing) has the phase limit, from 500.0.
    tracing = [task(f"worker:{i}", doing=progress.FIRST_STEP, sampled_at=1099.0,
                    advanced_at=20.0) for i in (0, 1)]
    tracing = [t._replace(doing_since=500.0) for t in tracing]
    assert clock.check(1099.0, tracing) is None
    hang = clock.check(1101.0, tracing)
    assert hang is not None and hang.limit == 600.0 and hang.idle == 601.0
    # An evaluation of 10 minutes ended at 700.0: the step limit counts from its end.
    after = [t._replace(doing="callbacks", doing_since=700.0)
             for t in tracing]
    assert clock.check(759.0, after) is None
    assert clock.check(761.0, after).limit == 60.0
    # Without the move (the old clock's view) the same tasks were hung long before.
    assert clock.check(759.0, [t._replace(doing_since=None)
                               for t in after]) is not None
    # One task tracing while the other waits in the step's collective: the tracer is
    # inside a step too (no "stuck outside a step" blame), like any task inside one.
    culprits, _ = blame(100.0, [task("worker:0", doing=progress.FIRST_STEP),
                                task("worker:1", doing=IN_STEP)])
    assert culprits == []


def test_a_fit_s_first_step_and_an_evaluation_after_training_are_marked_as_such():
    from tfrun.in_task.measure.metrics import _recorder_class

    class Base:
        def __init__(self):
            pass

    recorder = _recorder_class(Base, epoch_only=False)(batch_size=8)
    recorder.params = {"steps": 2, "epochs": 1}
    progress.reset()
    recorder.on_train_begin()
    assert progress.snapshot()["doing"] == progress.FIRST_STEP
    recorder.on_train_batch_begin(0)
    assert progress.snapshot()["doing"] == progress.FIRST_STEP  # the step that traces
    recorder.on_train_batch_end(0)
    recorder.on_train_batch_begin(1)
    assert progress.snapshot()["doing"] == IN_STEP
    recorder.on_train_batch_end(1)
    recorder.on_test_begin()  # fit's validation
    assert progress.snapshot()["doing"] == "evaluation"
    recorder.on_test_end()
    assert progress.snapshot()["doing"] == progress.BETWEEN_STEPS
    progress.doing("after training")  # (on_train_end's, without its flush)
    recorder.on_test_begin()
    recorder.on_test_end()
    assert progress.snapshot()["doing"] == "after training"
    recorder.on_train_begin()  # the next fit traces again
    recorder.on_train_batch_begin(0)
    assert progress.snapshot()["doing"] == progress.FIRST_STEP
    progress.reset()


def test_keras_checkpoint_callbacks_save_in_a_phase_of_their_own_other_callbacks_do_not():
    """A ModelCheckpoint of a large model on a slow disk took longer than the step limit
    and was called a hang. Keras' checkpoint callbacks (subclasses too) run their hooks in
    a phase with the longer limit; hooks Keras' class leaves default stay so (Keras calls
    batch hooks only for callbacks that override them); any other callback is untouched."""
    import keras

    from tfrun.in_task.measure.checkpoint_phase import mark_saving_callbacks

    class Mine(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.seen = progress.snapshot()["doing"]

    class SlowDisk(keras.callbacks.ModelCheckpoint):
        def on_epoch_end(self, epoch, logs=None):
            self.seen = progress.snapshot()["doing"]

    saving, mine = SlowDisk("/nonexistent/m.weights.h5", save_weights_only=True), Mine()
    restore = keras.callbacks.BackupAndRestore("/nonexistent")
    assert mark_saving_callbacks([saving, mine, restore]) == [saving, mine, restore]
    mark_saving_callbacks([saving])  # a second fit with the same callbacks: marked once
    progress.reset()
    progress.doing(progress.BETWEEN_STEPS)
    saving.on_epoch_end(0)
    mine.on_epoch_end(0)
    assert saving.seen == "the ModelCheckpoint callback (a checkpoint)"
    assert mine.seen == progress.BETWEEN_STEPS
    assert progress.snapshot()["doing"] == progress.BETWEEN_STEPS  # restored after the hook
    assert saving.on_epoch_end.__wrapped__.__func__ is SlowDisk.on_epoch_end
    assert not hasattr(saving.on_epoch_end.__wrapped__, "__wrapped__")
    assert "on_epoch_end" not in vars(mine)
    assert "on_predict_batch_end" not in vars(saving)  # Keras' default: left as is
    assert getattr(restore.on_train_begin, "_tfrun_phase", None) == \
        "the BackupAndRestore callback (a checkpoint)"
    progress.reset()


def test_the_auto_limit_follows_the_median_step_time():
    assert step_limit(None, None) == 60.0
    assert step_limit(10.0, None) == 200.0
    tasks = [task("worker:0", step_s=10.0), task("worker:1", step_s=12.0),
             task("worker:2", step_s=0.1)]
    assert HangClock().limits(tasks) == (200.0, 2000.0)
    assert HangClock().check(219.0, tasks) is None


def test_blame_of_a_stale_task_while_the_rest_finish_a_phase():
    culprits, waiting = blame(100.0, [task("worker:0", doing="evaluation"),
                                      task("worker:1", sampled_at=10.0, doing="evaluation")])
    assert [c.task for c in culprits] == ["worker:1"]
    assert waiting[0].why == "waiting in evaluation for worker:1"


def test_the_task_marks_its_steps_and_phases():
    progress.reset()
    clock = {"clock_began", "phase_seconds"}  # the phase clock's (test_goodput)

    def snapshot():
        return {k: v for k, v in progress.snapshot().items() if k not in clock}

    assert snapshot() == {"steps_done": 0, "doing": "setup"}
    progress.step_began()
    assert progress.snapshot()["doing"] == IN_STEP == progress.IN_STEP
    before = time.time()
    progress.step_ended()
    ended = progress.snapshot().pop("last_step_at")
    assert before <= ended <= time.time()
    with progress.busy("the backup"):
        time.sleep(0.02)
        assert snapshot() == {"steps_done": 1, "doing": "the backup", "last_step_at": ended}
    seconds = progress.snapshot()["phase_seconds"]
    assert seconds["the backup"] >= 0.02 and set(seconds) == {
        "setup", IN_STEP, progress.BETWEEN_STEPS, "the backup"}
    assert progress.snapshot()["doing"] == progress.BETWEEN_STEPS
    progress.reset()
    assert "last_step_at" not in progress.snapshot()


def test_a_custom_loop_s_logged_steps_are_its_progress():
    from tfrun.in_task.measure.metrics import log_metrics

    progress.reset()
    for step in (100, 100, 200, 150, 300):  # a step logged twice, or going back, is no progress
        log_metrics(step=step, loss=0.5)
    log_metrics(loss=0.25)  # no step: no progress either
    snapshot = progress.snapshot()
    assert snapshot.pop("last_step_at") <= time.time()
    del snapshot["clock_began"], snapshot["phase_seconds"]
    assert snapshot == {"steps_done": 3, "doing": progress.IN_STEP}
    progress.reset()


def test_the_task_logger_reads_progress_from_resources_samples(tmp_path, monkeypatch):
    clock = iter([101.0, 103.0, 105.0, 107.0, 109.0])
    monkeypatch.setattr("tfrun.launch.output.tasklog.time.monotonic", lambda: next(clock))
    logger = TaskLogger("worker:0", 0, tmp_path / "w.log",
                        ConsoleSink(io.StringIO(), color=False, live=False))

    def sample(steps, doing):
        logger._record_metrics(json.dumps({"time": 1.0, "event": "resources",
                                           "steps_done": steps, "doing": doing}))

    logger.reset_progress()                 # the (re)start
    sample(0, "setup")                      # 101
    assert logger.progress == (101.0, 0, "setup") and logger.advanced_at is None
    sample(10, IN_STEP)                     # 103: the first steps start the clock
    assert logger.advanced_at == 103.0 and logger.seconds_per_step is None
    sample(30, IN_STEP)                     # 105: 20 steps in 2 s
    assert logger.advanced_at == 105.0 and logger.seconds_per_step == pytest.approx(0.1)
    sample(30, "callbacks")                 # 107: no step: the clock runs on
    assert logger.advanced_at == 105.0 and logger.progress[2] == "callbacks"
    assert logger.doing_since == 107.0      # ... since it moved on to its callbacks
    sample(2, IN_STEP)                      # 109: a new process of the task (fewer steps)
    assert logger.advanced_at == 109.0 and logger.doing_since == 109.0


def test_stack_dumps_show_the_main_thread_first():
    dump = ["Thread 0x1 (most recent call first):", '  File "metrics.py", line 1 in sample', "",
            "Current thread 0x2 (most recent call first):", '  File "train.py", line 9 in <module>']
    assert main_thread_first(dump)[0].startswith("Current thread")
    assert main_thread_first(dump)[-1].endswith("in sample")


# ---------------------------------------------------------------- arrivals (issue 44.2)

def _in_step(task: str, exchanges, doing: str = IN_STEP, now: float = 100.0) -> TaskProgress:
    return TaskProgress(task, "h", now - 1, 30, doing, advanced_at=20.0, seconds_per_step=0.1,
                        exchanges=exchanges)


def test_the_task_that_never_arrived_at_the_collective_is_the_culprit():
    """Both inside a step at the same count (no phase or step count stands out): the
    arrival counts say worker:0 waits inside all-reduce #61 that worker:1 never entered."""
    hang = HangClock(step_timeout=None).check(
        100.0, [_in_step("worker:0", (61, 60)), _in_step("worker:1", (60, 60))])
    assert [(c.task, c.why) for c in hang.culprits] == [
        ("worker:1", "stuck inside a training step: never arrived at all-reduce #61, which "
                     "the others wait inside (it entered 60)")]
    assert [(w.task, w.why) for w in hang.waiting] == [
        ("worker:0", "waiting in all-reduce #61 for worker:1")]


def test_a_task_without_counts_has_not_reached_its_first_collective():
    # (past the phase limit: a task that says it is setting up gets the longer one)
    hang = HangClock(step_timeout=None).check(
        1000.0, [_in_step("worker:0", (1, 0), now=1000), _in_step("worker:1", None, "setup", 1000),
                 _in_step("worker:2", (1, 0), now=1000)])
    assert [c.task for c in hang.culprits] == ["worker:1"]
    assert [w.why for w in hang.waiting] == ["waiting in all-reduce #1 for worker:1"] * 2


def test_without_tfrun_s_exchange_the_counts_name_nobody():
    # TensorFlow's own collectives (--comm ring): no counts; nothing stands out either.
    hang = HangClock(step_timeout=None).check(
        100.0, [_in_step("worker:0", None), _in_step("worker:1", None)])
    assert hang.culprits == [] and "no task stands out" in hang.describe()
    # Everyone inside the same collective (a peer lost mid-exchange): nobody stands out.
    hang = HangClock(step_timeout=None).check(
        100.0, [_in_step("worker:0", (61, 60)), _in_step("worker:1", (61, 60))])
    assert hang.culprits == []


def test_a_sample_carries_the_loss_noted_at_the_step_it_is_due():
    """Issue 72: the loss is read only at a step that asks for a sample (every
    SAMPLE_STEPS steps, SAMPLE_FLOOR seconds apart), and travels in the typed sample."""
    from tfrun.records import TaskSample

    progress.reset()
    woken = []
    progress.sample_when_due(lambda: woken.append(1))
    try:
        due = []
        for _ in range(progress.SAMPLE_STEPS):
            progress.step_began()
            due.append(progress.due_after_this_step())
            if due[-1]:
                progress.note_loss(0.5)
            progress.step_ended()
        assert due == [False] * (progress.SAMPLE_STEPS - 1) + [True] and woken == [1]
        assert progress.snapshot()["loss"] == 0.5
        record = TaskSample(time=1.0, steps_done=5, doing="callbacks", loss=0.5).to_record()
        assert TaskSample.from_record(record).loss == 0.5
    finally:
        progress.sample_when_due(None)
        progress.reset()
