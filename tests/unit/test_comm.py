"""tfrun --comm: parsing, validation, and the way into a task (issue 15.3)."""

import types

import pytest

from tfrun.comm import CommOptions, from_env
from tfrun.errors import ConfigError
from tfrun.cli.run import config_from_args


@pytest.mark.parametrize("text, want", [
    ("ring", CommOptions("ring", 0, None)),
    ("NCCL", CommOptions("nccl", 0, None)),
    ("pack=4MB", CommOptions("auto", 4 << 20, None)),
    ("ring, pack=512K ,timeout=30", CommOptions("ring", 512 << 10, 30.0)),
    ("pack=1.5GiB", CommOptions("auto", int(1.5 * (1 << 30)), None)),
    ("pack=1048576", CommOptions("auto", 1 << 20, None)),
    ("timeout=0.5,auto", CommOptions("auto", 0, 0.5)),
    ("shm,timeout=60", CommOptions("shm", 0, 60.0)),
    ("tcp,compress=fp16", CommOptions("tcp", 0, None, "fp16")),
    ("compress=BF16,pack=1M", CommOptions("auto", 1 << 20, None, "bf16")),
    ("tcp,compress=none", CommOptions("tcp", 0, None)),
    ("shm,compress=bf16,feedback", CommOptions("shm", 0, None, "bf16", True)),
])
def test_comm_text_parses_and_round_trips(text, want):
    assert CommOptions.parse(text) == want
    assert CommOptions.parse(want.to_text()) == want


@pytest.mark.parametrize("text, named", [
    ("", "empty item"), ("ring,", "empty item"), ("rings", "'rings'"), ("pack=lots", "'lots'"),
    ("pack=-1", "'-1'"), ("timeout=0", "'0'"), ("timeout=inf", "'inf'"), ("bytes=4", "'bytes=4'"),
    ("compress=int8", "'int8'"), ("ring,compress=fp16", "'ring,compress=fp16'"),
    ("nccl,compress=bf16", "'nccl,compress=bf16'"),
])
def test_bad_comm_text_is_a_clear_error(text, named):
    with pytest.raises(ConfigError) as caught:
        CommOptions.parse(text)
    message = str(caught.value)
    assert named in message and "Fix: Pass e.g. --comm" in message and "Received:" in message


def test_comm_flag_is_validated_into_the_config_and_the_task_env(tmp_path):
    from tfrun.cluster import TaskId, Topology, plan_cluster
    from tfrun.launch.specs import spec_factory

    config = config_from_args(["--workers", "2", "--comm", "ring,pack=4MB", "t.py"], environ={})
    plan = plan_cluster(Topology(workers=2))
    spec = spec_factory(config, plan, tmp_path, with_tf_config=True, remote=False)(TaskId("worker", 1), 0)
    assert spec.env["TFRUN_COMM"] == "ring,pack=4194304"
    assert from_env(spec.env) == CommOptions("ring", 4 << 20, None)
    with pytest.raises(ConfigError, match="'fast'"):
        config_from_args(["--comm", "fast", "t.py"], environ={})
    assert "TFRUN_COMM" not in spec_factory(
        config_from_args(["--workers", "2", "t.py"], environ={}), plan, tmp_path,
        with_tf_config=True, remote=False)(TaskId("worker", 1), 0).env


def test_plain_strategy_gets_tfrun_options_unless_it_passes_its_own(monkeypatch):
    # A stand-in for TensorFlow's module (pure unit test; the real one: test_devices_and_comm).
    from tfrun.in_task.start import setup as _task_setup

    made = []

    class Strategy:
        def __init__(self, cluster_resolver=None, communication_options=None):
            made.append(communication_options)

    monkeypatch.setenv("TFRUN_COMM", "ring,pack=1MB")
    monkeypatch.setattr(CommOptions, "to_tf", lambda self: ("tf", self.implementation))
    _task_setup._default_communication_options(types.SimpleNamespace(CollectiveAllReduceStrategy=Strategy))
    Strategy()
    Strategy(communication_options="the script's")
    assert made == [("tf", "ring"), "the script's"]


def test_shm_is_tensorflow_auto_underneath_and_refused_across_hosts():
    pytest.importorskip("tensorflow")
    import tensorflow as tf

    assert CommOptions.parse("shm").to_tf().implementation == \
        tf.distribute.experimental.CommunicationImplementation.AUTO
    assert config_from_args(["--hosts", "h1,h1", "--comm", "shm", "t.py"], environ={}).comm == "shm"
    with pytest.raises(ConfigError) as caught:
        config_from_args(["--hosts", "h1,h2", "--comm", "shm", "t.py"], environ={})
    assert "one host" in str(caught.value) and "Received: --hosts h1,h2" in str(caught.value)
