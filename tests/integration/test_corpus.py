"""Issue 48: real-world program shapes run under tfrun as written (tests/scripts/corpus/,
and three plain programs of tests/scripts/plain/). Each runs alone (no strategy) and, beside
it, under ``tfrun --workers 2`` (MultiWorkerMirroredStrategy, the global batch split across the
workers), and, where the shape exists in tf_keras, under ``--keras 2`` against tf_keras
alone; the losses must agree within what the program's arithmetic allows.
docs/keras3-compatibility.md lists the shapes and what each met."""

import sys

import numpy as np
import pytest

from conftest import ROOT, Alone, Run, assert_nothing_left, history_of

pytestmark = pytest.mark.tf

CORPUS, PLAIN = ROOT / "tests" / "scripts" / "corpus", ROOT / "tests" / "scripts" / "plain"
#: program -> (relative tolerance, {log key: the factor 2 workers show against one process})
SHAPES = {
    CORPUS / "fit_callbacks.py": (1e-4, {}),
    CORPUS / "train_step_with_call.py": (1e-4, {"loss": 0.5}),  # compute_loss / replicas
    PLAIN / "pair_without_call.py": (1e-4, {}),
    CORPUS / "distiller.py": (1e-4, {}),
    PLAIN / "own_train_step_tracker.py": (1e-4, {"my_loss": 0.5}),
    CORPUS / "custom_metric.py": (1e-4, {}),
    PLAIN / "metric_variable.py": (1e-4, {}),
    CORPUS / "custom_loop.py": (1e-4, {}),
    CORPUS / "mixed_precision.py": (2e-2, {}),  # bfloat16 sums in another order
    CORPUS / "steps_per_execution.py": (1e-4, {}),
    CORPUS / "data_pipeline.py": (1e-4, {}),
    CORPUS / "functional_multi_io.py": (1e-4, {}),
    CORPUS / "cnn_digits.py": (1e-4, {}),
    CORPUS / "embedding_text.py": (1e-4, {}),
}
#: shapes that exist in tf_keras as written (no Keras-3-only API): also run with --keras 2
TF_KERAS = ("fit_callbacks.py", "custom_loop.py", "functional_multi_io.py",
            "embedding_text.py")
#: tf_keras alone: the programs write ``import keras``, as tfrun --keras 2 runs them
_AS_TF_KERAS = "import sys, runpy, tf_keras; sys.modules['keras'] = tf_keras; " \
               "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


def alone(program, flavour: str) -> Alone:
    return Alone([sys.executable, str(program)] if flavour == "3" else
                 [sys.executable, "-c", _AS_TF_KERAS, str(program)])


CASES = [pytest.param(p, "3", id=p.stem) for p in SHAPES] + [
    pytest.param(p, "2", id=f"{p.stem}-tf_keras") for p in SHAPES if p.name in TF_KERAS]


@pytest.mark.parametrize("program, flavour", CASES)
def test_a_program_shape_runs_under_tfrun_as_alone(tmp_path, program, flavour):
    rtol, factors = SHAPES[program]
    with alone(program, flavour) as by_itself:
        run = Run(tmp_path, ["--workers", "2", "--keras", flavour, "--quiet-tasks", str(program)])
        assert run.run(300) == 0, run.stdout[-4000:]
        want = history_of(by_itself.stdout())
    for task in ("worker-0", "worker-1"):
        got = history_of((run.run_dir / "logs" / f"{task}.log").read_text())
        assert sorted(got) == sorted(want), (got, want)
        for key, values in want.items():
            expected = np.array(values) * factors.get(key, 1.0)
            np.testing.assert_allclose(got[key], expected, rtol=rtol, atol=1e-6, err_msg=key)
    assert_nothing_left(run)


@pytest.mark.parametrize("flags, fixed", [(["--workers", "2"], True),
                                          (["--mirrored"], True),
                                          (["--workers", "2"], False)],
                         ids=["mwms", "mirrored", "mwms-without-the-fix"])
def test_an_unseeded_sampling_layer_trains_under_a_strategy(tmp_path, flags, fixed):
    """Issue 70.9: a VAE's sampling layer (``keras.random.normal`` with no seed in
    ``call()``) fails under every strategy in Keras as it is ("tf.function only supports
    singleton tf.Variables created on the first call"); with tfrun's compat fix it trains.
    Its losses are random: they must be finite and fall, on every worker."""
    program = CORPUS / "vae_sampling.py"
    tfrun_flags = [f for f in flags if f != "--mirrored"]
    env = {} if fixed else {"TFRUN_COMPAT_DISABLE": "unseeded_random_under_strategy"}
    run = Run(tmp_path, [*tfrun_flags, "--quiet-tasks", str(program),
                         *[f for f in flags if f == "--mirrored"]], env=env)
    code = run.run(300)
    if not fixed:  # the fix is what makes it train
        assert code != 0 and "singleton tf.Variables" in run.stdout + "".join(
            p.read_text() for p in (run.run_dir / "logs").glob("*.log")), run.stdout[-3000:]
        assert_nothing_left(run)
        return
    assert code == 0, run.stdout[-4000:]
    for log in sorted((run.run_dir / "logs").glob("*.log")):
        loss = history_of(log.read_text())["loss"]
        assert np.all(np.isfinite(loss)) and loss[-1] < loss[0], (log.name, loss)
    assert_nothing_left(run)
