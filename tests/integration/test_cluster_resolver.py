"""Every TF_CONFIG tfrun emits is accepted by TensorFlow's own TFConfigClusterResolver."""

import json

import pytest

from tfrun.cluster import Topology, plan_cluster

tf = pytest.importorskip("tensorflow")

PLANS = {
    "default-mwms": lambda: plan_cluster(Topology(workers=3)),
    "default-chief-ps-evaluator": lambda: plan_cluster(Topology(workers=2, chief=True, ps=2,
                                                                evaluator=True)),
    "default-hosts": lambda: plan_cluster(Topology(workers=2, chief=True),
                                          hosts=["10.0.0.1", "10.0.0.2:9000", "10.0.0.1"]),
    "uai": lambda: plan_cluster(hosts=["ip0", "ip1", "ip2", "ip3"], layout="uai", evaluator=True),
    "sagemaker": lambda: plan_cluster(hosts=["algo-1", "algo-2", "algo-3"], layout="sagemaker"),
}


@pytest.mark.parametrize("name", sorted(PLANS))
def test_tf_config_cluster_resolver_accepts_every_task(name, monkeypatch):
    plan = PLANS[name]()
    for config in plan.task_configs():
        monkeypatch.setenv("TF_CONFIG", config.to_json())
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        assert resolver.task_type == config.task.role
        assert resolver.task_id == config.task.index
        assert resolver.cluster_spec().as_dict() == json.loads(config.to_json())["cluster"]
        if config.address is not None:
            # The resolver's own view of this task's address matches ours.
            assert resolver.cluster_spec().task_address(config.task.role,
                                                        config.task.index) == config.address
