"""tfrun --mmap-threshold (tfrun.in_task.start.heap): parsing, validation, the way into a task, and the
task-side hook's order (TensorFlow's pin first, tfrun's threshold after). The effect on real
MatMuls: tests/integration/test_devices_and_comm.py::test_mmap_threshold_*."""

import threading
import types

import pytest

from tfrun.in_task.start import heap
from tfrun.errors import ConfigError
from tfrun.cli.run import config_from_args


@pytest.mark.parametrize("text, want", [
    ("32M", 32 << 20), ("4MiB", 4 << 20), ("512k", 512 << 10), ("131072", 131072),
    (" 1.5M ", int(1.5 * (1 << 20))), ("tf", None), ("TF", None),
])
def test_threshold_parses(text, want):
    assert heap.parse_threshold(text) == want


@pytest.mark.parametrize("text", ["", "0", "33M", "1G", "lots", "-4M", "4 MB please"])
def test_bad_threshold_is_a_clear_error(text):
    with pytest.raises(ConfigError) as caught:
        heap.parse_threshold(text)
    message = str(caught.value)
    assert repr(text) in message and "Fix: Pass e.g. --mmap-threshold" in message
    assert "Received:" in message


def test_flag_is_validated_into_the_config_and_every_task_env(tmp_path):
    from tfrun.cluster import TaskId, Topology, plan_cluster
    from tfrun.launch.specs import spec_factory

    plan = plan_cluster(Topology(workers=2))

    def task_env(argv, environ):
        config = config_from_args([*argv, "t.py"], environ=environ)
        return spec_factory(config, plan, tmp_path, with_tf_config=True, remote=False)(
            TaskId("worker", 1), 0).env

    assert task_env(["--workers", "2"], {})["TFRUN_MMAP_THRESHOLD"] == "32M"  # the default
    assert task_env(["--workers", "2", "--mmap-threshold", "tf"], {})["TFRUN_MMAP_THRESHOLD"] == "tf"
    # Like every flag, it reads TFRUN_<FLAG>; the command line wins.
    assert task_env(["--workers", "2"], {"TFRUN_MMAP_THRESHOLD": "4M"})["TFRUN_MMAP_THRESHOLD"] == "4M"
    with pytest.raises(ConfigError, match="'64M'"):
        config_from_args(["--mmap-threshold", "64M", "t.py"], environ={})
    from tfrun.launch.engines.base import CONTROLLED_ENV

    assert "TFRUN_MMAP_THRESHOLD" in CONTROLLED_ENV  # a stale value never leaks into a task


def test_hook_sets_the_threshold_once_after_the_first_initialisation(monkeypatch):
    # A stand-in for TensorFlow's Context (pure unit test; the real one: the integration test).
    calls = []

    class Context:
        def __init__(self):
            self._initialized = False

        def ensure_initialized(self):
            calls.append("tf initialises" if not self._initialized else "tf: already")
            self._initialized = True

    monkeypatch.setattr(heap, "_done", threading.Lock())
    monkeypatch.setattr(heap, "apply", lambda mallopt, threshold: calls.append(("apply", threshold)))
    heap._after_first_initialisation(types.SimpleNamespace(Context=Context), "mallopt", 4 << 20)
    first, second = Context(), Context()
    first.ensure_initialized()
    first.ensure_initialized()
    second.ensure_initialized()  # a reset context: TensorFlow's pin is once per process too
    assert calls == ["tf initialises", ("apply", 4 << 20), "tf: already", "tf initialises"]


def test_install_arms_only_for_a_size(monkeypatch):
    armed = []
    monkeypatch.setattr(heap, "when_imported", lambda name, callback: armed.append(name))
    assert not heap.install({})
    assert not heap.install({"TFRUN_MMAP_THRESHOLD": "tf"})
    with pytest.warns(UserWarning, match="TFRUN_MMAP_THRESHOLD ignored"):
        assert not heap.install({"TFRUN_MMAP_THRESHOLD": "huge"})
    assert heap.install({"TFRUN_MMAP_THRESHOLD": "32M"})
    assert armed == ["tensorflow.python.eager.context"]
