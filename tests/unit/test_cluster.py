"""Pure tests of the cluster model: layouts, dialects, and every validation rule."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tfrun.cluster import (ClusterPlan, ClusterSpec, TaskConfig, TaskId, Topology, parse_address,
                           parse_tf_config, plan_cluster)
from tfrun.errors import ConfigError


# --------------------------------------------------------------------------- layouts


def test_default_local_layout_puts_every_task_on_localhost_with_distinct_ports():
    plan = plan_cluster(Topology(workers=2, chief=True, ps=1, evaluator=True))
    assert plan.cluster.as_dict() == {
        "chief": ["localhost:2222"],
        "worker": ["localhost:2223", "localhost:2224"],
        "ps": ["localhost:2225"],
    }
    assert [str(t) for t in plan.tasks] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator:0"]


def test_default_host_list_assigns_roles_in_order_and_keeps_explicit_ports():
    plan = plan_cluster(Topology(workers=2, chief=True), hosts=["a", "b:9000", "c"])
    assert plan.cluster.as_dict() == {"chief": ["a:2222"], "worker": ["b:9000", "c:2222"]}


def test_default_host_list_without_counts_makes_every_host_a_worker():
    plan = plan_cluster(hosts=["a", "b", "a"])
    assert plan.cluster.as_dict() == {"worker": ["a:2222", "b:2222", "a:2223"]}


def test_host_count_must_match_task_count():
    with pytest.raises(ConfigError, match=r"3 host\(s\) given for 2 training task\(s\)"):
        plan_cluster(Topology(workers=2), hosts=["a", "b", "c"])


def test_uai_layout_matches_seed_001():
    plan = plan_cluster(hosts=["ip0", "ip1", "ip2", "ip3"], layout="uai")
    configs = plan.task_configs()
    assert len(configs) == 8
    roles = [c.task.role for c in configs]
    assert roles.count("ps") == 4 and roles.count("chief") == 1 and roles.count("worker") == 3
    cluster = configs[0].to_dict()["cluster"]
    assert cluster == {
        "chief": ["ip0:2222"],
        "worker": ["ip1:2222", "ip2:2222", "ip3:2222"],
        "ps": ["ip0:2223", "ip1:2223", "ip2:2223", "ip3:2223"],
    }
    assert all(c.to_dict()["cluster"] == cluster for c in configs)
    assert all(c.to_dict()["environment"] == "cloud" for c in configs)
    addresses = [c.address for c in configs]
    assert len(set(addresses)) == 8


def test_uai_layout_on_repeated_localhost_gets_unique_ports():
    plan = plan_cluster(hosts=["localhost"] * 3, layout="uai")
    addresses = list(plan.cluster.addresses().values())
    assert len(addresses) == 6 and len(set(addresses)) == 6


def test_uai_explicit_ports_put_ps_on_the_next_port():
    plan = plan_cluster(hosts=["a:5000", "b:6000"], layout="uai")
    assert plan.cluster.as_dict() == {"chief": ["a:5000"], "worker": ["b:6000"],
                                      "ps": ["a:5001", "b:6001"]}


def test_uai_explicit_ports_that_collide_with_ps_are_rejected():
    with pytest.raises(ConfigError, match="ps on port 5001"):
        plan_cluster(hosts=["a:5000", "a:5001"], layout="uai")


def test_sagemaker_layout_uses_fixed_ports_and_ps_only_with_several_hosts():
    one = plan_cluster(hosts=["algo-1"], layout="sagemaker")
    assert one.cluster.as_dict() == {"chief": ["algo-1:2222"]}
    two = plan_cluster(hosts=["algo-1", "algo-2"], layout="sagemaker", base_port=4000)
    assert two.cluster.as_dict() == {"chief": ["algo-1:2222"], "worker": ["algo-2:2222"],
                                     "ps": ["algo-1:2223", "algo-2:2223"]}


def test_named_layouts_reject_role_counts():
    with pytest.raises(ConfigError, match="derives its roles"):
        plan_cluster(Topology(workers=3), hosts=["a"], layout="uai")


def test_unknown_layout_and_bad_base_port():
    with pytest.raises(ConfigError, match="Unknown layout 'k8s'"):
        plan_cluster(layout="k8s")
    with pytest.raises(ConfigError, match="Invalid base port"):
        plan_cluster(base_port=70000)


def test_evaluator_is_outside_the_cluster_and_has_no_address():
    plan = plan_cluster(Topology(workers=1, evaluator=True))
    evaluator = plan.task_configs()[-1]
    assert evaluator.to_dict() == {"cluster": {"worker": ["localhost:2222"]},
                                   "task": {"type": "evaluator", "index": 0}}
    assert evaluator.address is None


def test_with_ports_moves_only_the_given_tasks():
    plan = plan_cluster(Topology(workers=2))
    moved = plan.with_ports({TaskId("worker", 1): 40001})
    assert moved.cluster.as_dict() == {"worker": ["localhost:2222", "localhost:40001"]}


# --------------------------------------------------------------------------- topology rules


@pytest.mark.parametrize("kwargs, message", [
    (dict(workers=-1), "--workers must be a non-negative integer"),
    (dict(workers=0), "no chief and no worker"),
    (dict(workers=0, chief=True, ps=1), "needs workers"),
    (dict(ps=-2), "--ps must be a non-negative integer"),
])
def test_topology_rules(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Topology(**kwargs)


# --------------------------------------------------------------------------- parse and normalise


def test_master_is_normalised_to_chief():
    config = parse_tf_config('{"cluster":{"master":["a:1"],"worker":["b:1"]},'
                             '"task":{"type":"master","index":0}}')
    assert config.to_dict() == {"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                                "task": {"type": "chief", "index": 0}}
    assert "master" not in config.to_json()


def test_kubeflow_evaluator_inside_cluster_is_normalised_out():
    kubeflow = {"cluster": {"chief": ["c:1"], "worker": ["w:1"], "evaluator": ["e:1"]},
                "task": {"type": "evaluator", "index": 0}}
    outside = {"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
               "task": {"type": "evaluator", "index": 0}}
    assert parse_tf_config(kubeflow) == parse_tf_config(outside)
    assert parse_tf_config(kubeflow).to_dict() == outside


def test_environment_cloud_and_rpc_layer_are_kept():
    config = parse_tf_config({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0},
                              "environment": "cloud", "rpc_layer": "grpc"})
    assert config.to_dict()["environment"] == "cloud"
    assert config.to_dict()["rpc_layer"] == "grpc"


def test_single_address_string_is_accepted_as_a_list():
    config = parse_tf_config({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}})
    assert config.cluster.worker == ("a:1",)


def test_missing_index_defaults_to_zero():
    config = parse_tf_config({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}})
    assert config.task == TaskId("worker", 0)


@pytest.mark.parametrize("tf_config, message", [
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}',
     "not valid JSON"),
    ("[1, 2]", "not a JSON object"),
    ({"cluster": {"boss": ["a:1"]}, "task": {"type": "worker", "index": 0}},
     "Unknown role 'boss' in TF_CONFIG cluster"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "boss", "index": 0}},
     "Unknown role 'boss' in TF_CONFIG task.type"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}},
     r"worker:1 is out of range"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}},
     r"ps:0 is out of range"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": -1}},
     "not a non-negative integer"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": "0"}},
     "not a non-negative integer"),
    ({"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}},
     "Duplicate address 'a:1'"),
    ({"cluster": {"chief": ["a:1"], "worker": ["a:1"]}, "task": {"type": "worker", "index": 0}},
     "Duplicate address 'a:1'"),
    ({"cluster": {"worker": ["a:0"]}, "task": {"type": "worker", "index": 0}}, "Invalid port"),
    ({"cluster": {"worker": ["a:65536"]}, "task": {"type": "worker", "index": 0}}, "Invalid port"),
    ({"cluster": {"worker": ["a:http"]}, "task": {"type": "worker", "index": 0}}, "Invalid port"),
    ({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 0}}, "has no port"),
    ({"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}},
     "has 2 chiefs"),
    ({"cluster": {"master": ["a:1"], "chief": ["b:1"]}, "task": {"type": "chief", "index": 0}},
     "has 2 chiefs"),
    ({"cluster": {"ps": ["a:1"]}, "task": {"type": "ps", "index": 0}},
     "parameter servers but no chief or worker"),
    ({"cluster": {}, "task": {"type": "worker", "index": 0}}, "cluster is empty"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "evaluator", "index": 1}},
     "Evaluator index is 1"),
    ({"cluster": {"worker": ["a:1"], "evaluator": ["e:1", "e:2"]},
      "task": {"type": "worker", "index": 0}}, "lists 2 evaluators"),
    ({"task": {"type": "worker", "index": 0}}, "has no 'cluster'"),
    ({"cluster": {"worker": ["a:1"]}}, "has no valid 'task'"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}, "clustr": {}}, "unknown key"),
    ({"cluster": ["a:1"], "task": {"type": "worker", "index": 0}}, "'cluster' is not an object"),
    ({"cluster": {"worker": [1]}, "task": {"type": "worker", "index": 0}}, "not a list of addresses"),
    ({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker"}, "environment": 3},
     "'environment' is not a string"),
])
def test_every_validation_rule_raises_a_clear_config_error(tf_config, message):
    with pytest.raises(ConfigError, match=message) as info:
        parse_tf_config(tf_config if isinstance(tf_config, str) else json.dumps(tf_config))
    text = str(info.value)
    assert "Expected" in text and "Fix:" in text and "Received:" in text
    assert "\n" not in text
    assert info.value.exit_code == 2


@pytest.mark.parametrize("address, expected", [
    ("host:1", ("host", 1)), ("10.1.2.3:65535", ("10.1.2.3", 65535)),
    ("[::1]:2222", ("::1", 2222)), ("[fe80::1]", ("fe80::1", None)), ("node", ("node", None)),
])
def test_parse_address(address, expected):
    assert parse_address(address) == expected


@pytest.mark.parametrize("address", ["", ":80", "a:b:c", "[::1", "[::1]80", "a:-1", "a: 1"])
def test_parse_address_rejects_malformed(address):
    with pytest.raises(ConfigError):
        parse_address(address)


# --------------------------------------------------------------------------- properties

hosts = st.sampled_from(["localhost", "10.0.0.1", "node-a", "node-b", "[::1]"])


@st.composite
def topologies_and_hosts(draw):
    chief = draw(st.booleans())
    workers = draw(st.integers(min_value=0 if chief else 1, max_value=6))
    ps = draw(st.integers(min_value=0, max_value=4)) if workers else 0
    topology = Topology(workers=workers, chief=chief, ps=ps, evaluator=draw(st.booleans()))
    n = len(topology.training_tasks())
    host_list = draw(st.one_of(st.none(), st.lists(hosts, min_size=n, max_size=n)))
    return topology, host_list


@given(topologies_and_hosts(), st.integers(min_value=1, max_value=60000))
@settings(max_examples=300, deadline=None)
def test_random_topologies_share_one_cluster_dense_indices_unique_addresses(case, base_port):
    topology, host_list = case
    plan = plan_cluster(topology, hosts=host_list, base_port=base_port)
    configs = plan.task_configs()
    dicts = [c.to_dict() for c in configs]
    assert all(d["cluster"] == dicts[0]["cluster"] for d in dicts)
    for role, addresses in dicts[0]["cluster"].items():
        indices = sorted(d["task"]["index"] for d in dicts if d["task"]["type"] == role)
        assert indices == list(range(len(addresses)))
    addresses = [c.address for c in configs if c.address is not None]
    assert len(addresses) == len(set(addresses)) == len(topology.training_tasks())
    assert ("evaluator" in [d["task"]["type"] for d in dicts]) == topology.evaluator
    for config in configs:
        assert parse_tf_config(config.to_json()) == config
        assert parse_tf_config(config.to_dict()) == config


@given(st.lists(hosts, min_size=1, max_size=6), st.sampled_from(["uai", "sagemaker"]))
@settings(max_examples=100, deadline=None)
def test_named_layouts_roundtrip_and_have_unique_addresses(host_list, layout):
    plan = plan_cluster(hosts=host_list, layout=layout)
    addresses = list(plan.cluster.addresses().values())
    assert len(addresses) == len(set(addresses))
    assert plan.cluster.size("chief") == 1
    assert plan.cluster.size("worker") == len(host_list) - 1
    for config in plan.task_configs():
        assert parse_tf_config(config.to_json()) == config


def test_cluster_plan_and_spec_are_frozen():
    plan = ClusterPlan(cluster=ClusterSpec(worker=("a:1",)))
    with pytest.raises(AttributeError):
        plan.evaluator = True  # type: ignore[misc]
    with pytest.raises(AttributeError):
        plan.cluster.worker = ()  # type: ignore[misc]
    assert TaskConfig(plan.cluster, TaskId("worker", 0)).address == "a:1"


@pytest.mark.parametrize("addresses, said", [
    (["localhost:2222", "127.0.0.1:2222"], "name the same machine and port"),
    (["127.0.0.1:2222", "127.0.1.1:2222"], "name the same machine and port"),
    (["[::1]:2222", "LOCALHOST:2222"], "name the same machine and port"),
    (["0.0.0.0:2222"], "is a wildcard"),
    (["localhost:2222", "[::]:2223"], "is a wildcard"),
])
def test_aliases_of_one_machine_and_port_and_wildcards_are_rejected(addresses, said):
    """Issue 14.7: these used to be accepted, then the cluster hung."""
    with pytest.raises(ConfigError, match=said):
        ClusterSpec(worker=tuple(addresses))


def test_distinct_ports_on_loopback_aliases_are_fine():
    assert ClusterSpec(worker=("localhost:2222", "127.0.0.1:2223")).size("worker") == 2
