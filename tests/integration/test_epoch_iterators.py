"""Keras 3 fit() under multi-worker MWMS: one distributed iterator per epoch, dropped off
the training thread (tfrun.in_task.compat's epoch_iterators_multi_worker), with real tasks.

Without the fix Keras makes two per epoch (the second is thrown away unused) and drops
each in the training thread, which then waits for tf.data's background threads."""

import json
import math

import pytest

from conftest import ROOT, Run

pytestmark = pytest.mark.tf
SCRIPT = ROOT / "tests" / "scripts" / "epoch_iterators.py"
FIX = "epoch_iterators_multi_worker"
RELEASE_THREAD = "tfrun-iterator-release"
EPOCHS = 3  # the script's


def iterators(tmp_path, name: str, env: dict) -> dict[str, dict]:
    run = Run(tmp_path, ["--workers", "2", str(SCRIPT)], env=env, name=name)
    assert run.run(300) == 0, run.stdout[-3000:]
    found = {line[1:line.index("]")]: json.loads(line.split("iterators: ", 1)[1])
             for line in run.stdout.splitlines() if "] iterators: {" in line}
    assert sorted(found) == ["worker:0", "worker:1"], run.stdout[-3000:]
    return found


def test_one_iterator_per_epoch_dropped_off_the_training_thread(tmp_path):
    fixed = iterators(tmp_path, "fixed", {})
    stock = iterators(tmp_path, "stock", {"TFRUN_COMPAT_DISABLE": FIX})
    for task in fixed:
        got, keras = fixed[task], stock[task]
        assert all(math.isfinite(loss) for loss in got["loss"]), got
        # Keras makes one extra iterator per epoch (plus, either way, one for the model's
        # symbolic build); with the fix those are not made.
        assert keras["finite"]["made"] - got["finite"]["made"] == EPOCHS, (got, keras)
        # Epochs 1 and 2's iterators are dropped once the next epoch has stepped, off the
        # training thread; the last one stays with fit() until it returns.
        assert got["finite"]["dropped_by"].count(RELEASE_THREAD) == EPOCHS - 1, got
        assert RELEASE_THREAD not in keras["finite"]["dropped_by"], keras
        # A repeated dataset with steps_per_epoch keeps its iterator across epochs: unchanged.
        assert got["repeated_made"] == keras["repeated_made"], (got, keras)
