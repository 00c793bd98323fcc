"""The test harness's choice of warm starters by Keras flavour (tests/warm_tasks.py): a run
given the other flavour's starter would be declined and import TensorFlow cold."""

import pytest

import warm_tasks


@pytest.mark.parametrize("args, environ, legacy", [
    (["--workers", "2", "train.py"], {}, False),
    (["--workers", "2", "--keras", "2", "train.py"], {}, True),
    (["--workers", "2", "--keras=2", "train.py"], {}, True),
    (["--keras", "3", "train.py"], {}, False),
    (["--keras=3", "train.py"], {}, False),
    (["train.py"], {"TFRUN_KERAS": "2"}, True),
    (["train.py"], {"TF_USE_LEGACY_KERAS": "1"}, True),
    (["train.py", "--workers", "2"], {"TFRUN_KERAS": "3"}, False),
])
def test_a_run_that_gives_its_tasks_tf_keras_is_told_apart(args, environ, legacy):
    assert warm_tasks.legacy_keras(args, environ) is legacy
