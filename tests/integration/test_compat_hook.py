"""The compat post-import hook, the version guard and the switches (real Keras, subprocesses)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.tf

PROBE = """
import json, sys, warnings
warnings.simplefilter("always")
from tfrun.in_task.start import setup as _task_setup
from tfrun.in_task import compat
_task_setup.prepare()
before = compat.applied()
with warnings.catch_warnings(record=True) as caught:
    import keras
try:
    from keras.src.backend.tensorflow import trainer
    wrapped = hasattr(trainer.reduce_per_replica, "__wrapped__")
except ImportError:  # tf_keras has no keras.src.backend.tensorflow
    wrapped = False
print(json.dumps({"before": before, "after": compat.applied(), "version": keras.__version__,
                  "wrapped": wrapped,
                  "warnings": [str(w.message) for w in caught if "tfrun" in str(w.message)]}))
"""


def probe(**env):
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TFRUN_", "TF_USE_LEGACY"))}
    result = subprocess.run([sys.executable, "-c", PROBE], env={**base, **env, "TF_CPP_MIN_LOG_LEVEL": "3"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_fixes_are_applied_right_after_keras_is_imported():
    out = probe()
    assert out["before"] == []
    assert out["after"] == ["mwms_symbolic_build", "mwms_reduce_logs", "distributed_assign_add",
                            "batchnorm_moving_stats", "steps_per_execution",
                            "optimizer_build_in_replica_context", "layer_build_in_replica_context",
                            "backup_and_restore_multi_worker", "fit_under_parameter_server",
                            "epoch_iterators_multi_worker", "worker_saves", "model_without_call",
                            "loss_scale_note", "unseeded_random_under_strategy"]
    assert out["wrapped"] and out["warnings"] == []


def test_fixes_can_be_switched_off():
    out = probe(TFRUN_COMPAT_DISABLE="mwms_reduce_logs,steps_per_execution")
    assert "mwms_reduce_logs" not in out["after"] and "steps_per_execution" not in out["after"]
    assert not out["wrapped"]
    assert probe(TFRUN_COMPAT_DISABLE="all")["after"] == []


def test_untested_keras_version_warns_and_skips():
    # Keras already imported (and pretending to be 3.99): install() applies at once.
    patched = "import keras; keras.__version__ = '3.99.0'\n" + PROBE
    base = {k: v for k, v in os.environ.items() if not k.startswith("TFRUN_")}
    result = subprocess.run([sys.executable, "-c", patched], env={**base, "TF_CPP_MIN_LOG_LEVEL": "3"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    out = json.loads(result.stdout.strip().splitlines()[-1])
    assert out["after"] == []
    assert "tested on Keras 3.15; found 3.99.0: skipped" in result.stderr


def test_keras2_mode_aliases_keras_to_tf_keras_and_applies_only_the_tf_keras_fixes():
    out = probe(TFRUN_KERAS="2", TF_USE_LEGACY_KERAS="1")
    assert out["version"].startswith("2.")
    assert out["after"] == ["h5_load_under_strategy"] and out["warnings"] == []
