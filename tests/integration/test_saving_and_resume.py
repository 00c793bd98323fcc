"""Tier 3 + fault injection: chief-aware saving and exact resume across a gang restart."""

import glob
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf
SCRIPT = str(ROOT / "tests" / "scripts" / "resume.py")


def weights(path):
    data = np.load(path)
    return [data[f"arr_{i}"] for i in range(4)], data


@pytest.mark.parametrize("flavour", ["3", "2"], ids=["keras3", "tf_keras"])
def test_worker_crash_restart_resumes_exactly_and_saves_once(tmp_path, flavour):
    env = {"TF_USE_LEGACY_KERAS": "1"} if flavour == "2" else {}
    clean = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--quiet-tasks", SCRIPT,
                           str(tmp_path / "clean"), "-1"], env=env, name="clean")
    assert clean.run(300) == 0, clean.stdout[-3000:]
    crashed = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--max-restarts", "1",
                             "--quiet-tasks", SCRIPT, str(tmp_path / "crashed"), "1"], env=env,
                  name="crashed")
    assert crashed.run(300) == 0, crashed.stdout[-3000:]
    assert crashed.summary["restarts"] == 1
    restart_event = next(e for e in crashed.events() if e["event"] == "restart")
    assert restart_event["cause"] == "worker:1" and restart_event["exit_code"] == 17

    want, _ = weights(tmp_path / "clean-worker-0.npz")
    for i in range(2):
        got, data = weights(tmp_path / f"crashed-worker-{i}.npz")
        # The second attempt resumed after the backed-up epoch 1: it ran epochs 2 and 3 only.
        assert list(data["epochs_run"]) == [2, 3]
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, atol=1e-6)

    # tfrun.save: exactly one model file, written by the chief (worker:0), which loads.
    for run in (clean, crashed):
        saved = glob.glob(str(run.run_dir / "**" / "model.keras"), recursive=True)
        assert saved == [str(run.run_dir / "output" / "model.keras")]
    assert str(np.load(tmp_path / "clean-worker-1.npz")["saved"]) == ""
    # tf.keras is tf_keras when TF_USE_LEGACY_KERAS=1 (flavour 2), Keras 3 otherwise.
    check = ("import sys, numpy as np, tensorflow as tf; m = tf.keras.models.load_model(sys.argv[1]); "
             "print(m.predict(np.zeros((1, 6), 'float32'), verbose=0).shape)")
    loaded = subprocess.run([sys.executable, "-c", check, str(clean.run_dir / "output" / "model.keras")],
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert loaded.returncode == 0 and "(1, 2)" in loaded.stdout, loaded.stderr[-2000:]
    assert_nothing_left(crashed)
