"""A stuck worker is found by progress, named with its stack, and the other labelled as
waiting for it (issue 44: tfrun.launch.supervise.hang, tfrun.in_task.progress)."""

import pytest

from conftest import Run, assert_nothing_left

pytestmark = pytest.mark.tf

SCRIPT = "tests/scripts/stuck_worker.py"


@pytest.mark.parametrize("flavour, flags, limit", [
    ("3", [], 60.0),                           # the defaults: max(60 s, 20 x median step)
    ("2", ["--step-timeout", "15"], 15.0),
], ids=["keras3-defaults", "tf_keras-step-timeout"])
def test_a_worker_stuck_in_its_callback_is_named_with_its_stack(tmp_path, flavour, flags, limit):
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "2" else {}
    run = Run(tmp_path, ["--workers", "2", "--keras", flavour, *flags, SCRIPT, "worker:1", "30"],
              env=env)
    assert run.run(timeout=400) == 124, run.stdout[-5000:]
    assert "worker:1: stuck in a callback after step 30" in run.stdout
    hang = run.summary["hang"]
    assert hang["limit_seconds"] == limit
    # Samples come every 2 s: the hang is declared within a few seconds of the limit
    # (idle_seconds is rounded to 0.1 s: just over the limit reads as the limit).
    assert limit <= hang["idle_seconds"] <= limit + 10, hang
    assert [(c["task"], c["steps_done"], c["doing"]) for c in hang["culprits"]] \
        == [("worker:1", 30, "callbacks")]
    assert hang["culprits"][0]["host"]
    assert [(w["task"], w["doing"], w["why"]) for w in hang["waiting"]] \
        == [("worker:0", "a training step", "waiting in a training step for worker:1")]
    assert run.summary["root_cause"]["task"] == "worker:1"
    assert run.tasks()["worker:1"]["note"].startswith("hang culprit: stuck in callbacks")
    # The console names it, then shows its stacks with the main thread (the callback) first.
    assert "the culprit: worker:1" in run.stdout
    stacks = run.stdout.split("worker:1's Python stacks, main thread first")[1]
    first = stacks.split("(most recent call first)")[1]
    assert "stuck_worker.py" in first and "on_train_batch_end" in first, stacks[:3000]
    assert_nothing_left(run)
