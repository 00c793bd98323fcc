"""Which all-reduces tfrun's exchange takes over (tfrun.in_task.exchange.allreduce), with a stand-in
for TensorFlow's per-replica collective launcher (a pure unit test: no cluster). The GPU
path cannot run here: these check that a GPU replica's all-reduce goes to TensorFlow's own
launcher (NCCL on a GPU host) untouched, and never forms a TCP group."""

import types

import pytest

tf = pytest.importorskip("tensorflow")

from tensorflow.python.distribute import collective_util  # noqa: E402

from tfrun.in_task.exchange import allreduce  # noqa: E402
from tfrun.in_task.exchange.tcp_allreduce import TcpPlan  # noqa: E402

PLAN = TcpPlan(rank=0, names=("worker:0", "worker:1"), hosts=("node-1", "node-2"))


class FakeLauncher:
    """What the hook reads of TensorFlow's CollectiveReplicaLauncher."""

    def __init__(self, device, group_size=2, implementation="AUTO"):
        self._device = device
        self._group_size = group_size
        self._options = types.SimpleNamespace(merge=lambda options: types.SimpleNamespace(
            implementation=getattr(collective_util.CommunicationImplementation, implementation),
            timeout_seconds=None))
        self.calls = []

    def all_reduce(self, input_tensor, control_input=None, options=None):
        self.calls.append("tensorflow all_reduce")
        return input_tensor

    def batch_all_reduce(self, input_tensor_packs, options=None):
        self.calls.append("tensorflow batch_all_reduce")
        return [t for pack in input_tensor_packs for t in pack]


@pytest.mark.parametrize("device, size, implementation, applies", [
    ("/job:worker/replica:0/task:0/device:CPU:0", 2, "AUTO", True),
    ("/job:worker/replica:0/task:0/device:GPU:0", 2, "AUTO", False),   # NCCL's
    ("/job:worker/replica:0/task:0/device:CPU:0", 2, "NCCL", False),   # the script chose
    ("/job:worker/replica:0/task:0/device:CPU:0", 4, "AUTO", False),   # several replicas each
    ("/job:localhost/replica:0/task:0/device:CPU:0", 2, "AUTO", False),
])
def test_only_this_clusters_one_cpu_replica_per_worker_all_reduces_are_taken(
        device, size, implementation, applies):
    launcher = FakeLauncher(device, size, implementation)
    options = launcher._options.merge(None)
    assert allreduce._applies(launcher, PLAN, tf.constant([1.0]), options) is applies
    assert allreduce._applies(launcher, PLAN, tf.constant([1]), options) is False  # integers


def test_a_gpu_replicas_all_reduce_goes_to_tensorflow_and_forms_no_group(monkeypatch):
    module = types.SimpleNamespace(CollectiveReplicaLauncher=type(
        "Launcher", (FakeLauncher,), {}))
    monkeypatch.setattr(allreduce, "_group", None)
    allreduce._hook(module, PLAN)
    launcher = module.CollectiveReplicaLauncher("/job:worker/replica:0/task:1/device:GPU:0")
    value = tf.constant([1.0, 2.0])
    assert launcher.all_reduce(value) is value
    assert launcher.batch_all_reduce([[value, value]]) == [value, value]
    assert launcher.calls == ["tensorflow all_reduce", "tensorflow batch_all_reduce"]
    assert allreduce.current_group() is None and allreduce.current_exchange() is None
