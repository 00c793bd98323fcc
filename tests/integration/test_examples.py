"""Every seed program in examples/ runs under tfrun with the strategy its seed uses."""

import re

import pytest

from conftest import ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf

EXAMPLES = {
    # example: (tfrun flags, script args, strategy the seed uses, a line that proves it trained)
    "keras_guide_mlp.py": (["--devices", "2"], [], "MirroredStrategy",
                             r"test \[loss, accuracy\]: \[[0-9.]+, (0\.[89]\d*|1\.0)"),
    "mirrored_cnn.py": (["--devices", "2"], ["--epochs", "4"], "MirroredStrategy",
                       r"Test Accuracy: (0\.[89]\d*|1\.0)"),
    "custom_training_loop.py": (["--devices", "2"], ["--epochs", "6"], "MirroredStrategy",
                               r"Test Accuracy: (0\.[89]\d*|1\.0)"),
    "multiworker_mobilenet.py": (["--workers", "2"], ["--epochs", "1", "--steps", "3"],
                                         "MultiWorkerMirroredStrategy", r"final loss: [0-9.]+"),
    "ps_training.py": (["--chief", "--workers", "2", "--ps", "1"], ["--epochs", "6"],
                       "ParameterServerStrategy", r"\[chief:0\] test accuracy: (0\.[89]\d*|1\.0)"),
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_seed_example_runs_under_tfrun(tmp_path, example):
    flags, args, strategy, proof = EXAMPLES[example]
    run = Run(tmp_path, [*flags, str(ROOT / "examples" / example), *args])
    assert run.run(timeout=400) == 0, run.stdout[-3000:]
    assert re.search(proof, run.stdout), run.stdout[-3000:]
    # tfrun's own start adds no error lines (it once made a coordinator log 18 gRPC
    # "Tried to remove non-existent function" errors for functions the ps never had).
    logs = "".join(p.read_text() for p in (run.run_dir / "logs").glob("*.log"))
    assert "Tried to remove non-existent function" not in logs + run.stdout
    # The strategy the seed asks for, with 2 replicas (2 logical CPUs or 2 workers); TF's
    # class behind MultiWorkerMirroredStrategy is CollectiveAllReduceStrategy.
    if strategy == "ParameterServerStrategy":
        # The script ran on the coordinator only; ps and workers were plain servers.
        assert re.findall(r"\[(\w+:\d)\] ParameterServerStrategyV2 on", run.stdout) == ["chief:0"]
        assert_nothing_left(run)
        return
    tf_class = "MirroredStrategy" if strategy == "MirroredStrategy" else r"_?CollectiveAllReduceStrategy\w*"
    printed = re.findall(rf"\[(\w+:\d)\] ({tf_class}): 2 replicas", run.stdout)
    assert len(printed) == (1 if strategy == "MirroredStrategy" else 2), run.stdout[-2000:]
    assert_nothing_left(run)


def test_the_complete_script_of_writing_your_script_runs_as_written(tmp_path):
    """The docs' complete script (docs/writing-your-script.md), as a newcomer copies it:
    2 workers train, the chief prints the accuracy, and the saved model is in the run
    directory where the page says."""
    page = (ROOT / "docs" / "writing-your-script.md").read_text()
    section = page.split("## A complete script", 1)[1]
    script = section.split("```python\n", 1)[1].split("```", 1)[0]
    (tmp_path / "train.py").write_text(script)
    run = Run(tmp_path, ["--workers", "2", str(tmp_path / "train.py")])
    assert run.run(timeout=400) == 0, run.stdout[-3000:]
    assert re.search(r"\[worker:0\] test accuracy: (0\.9\d*|1\.0)", run.stdout), run.stdout[-3000:]
    assert (run.run_dir / "output" / "model.keras").is_file()
    assert_nothing_left(run)
