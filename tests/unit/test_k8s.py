"""tfrun k8s: JobSet/TFJob manifests, TF_CONFIG in the pod, --check (pure; no API server here).

Generated manifests are validated against the CRDs' OpenAPI schemas (read from
../shared/engines/k8s, skipped with the reason where that folder is absent) with the
apiserver's strict unknown-field rule, and their pod templates as core/v1 Pods with
kubernetes-validate. tests/multihost/test_k8s_pods.py runs the pods on fake hosts.
"""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tfrun.cli import main
from tfrun.cluster import Topology
from tfrun.errors import ConfigError
from tfrun.launch.engines.kubernetes import K8sJob, check_manifest, job_manifest
from tfrun.in_task.start.pod import jobset_tf_config, pod_hostnames, wait_for_peers

SCHEMAS = Path(__file__).resolve().parents[3] / "shared" / "engines" / "k8s"
TOPOLOGIES = {
    "mwms": Topology(workers=2),
    "mwms-chief": Topology(workers=2, chief=True),
    "ps": Topology(workers=2, chief=True, ps=1),
    "evaluator": Topology(workers=2, chief=True, evaluator=True),
}


def job(kind="jobset", topology=Topology(workers=2), **kw) -> K8sJob:
    return K8sJob(name="mnist", image="registry/train:1", command=("train.py", "--epochs", "3"),
                  topology=topology, kind=kind, **kw)


# --------------------------------------------------------------------------- schemas


def _crd_schema(filename: str, version: str) -> dict:
    if not SCHEMAS.is_dir():
        pytest.skip(f"{SCHEMAS} is absent (the CRD schemas are read from there, not copied)")
    crd = yaml.safe_load((SCHEMAS / filename).read_text())
    return next(v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]
                if v["name"] == version)


def _unknown_fields(obj, schema, path="$") -> list[str]:
    """The apiserver's strict field validation: fields the structural schema does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    errors = []
    if isinstance(obj, dict):
        props, extra = schema.get("properties"), schema.get("additionalProperties")
        for key, value in obj.items():
            if props is not None and key in props:
                errors += _unknown_fields(value, props[key], f"{path}.{key}")
            elif isinstance(extra, dict):
                errors += _unknown_fields(value, extra, f"{path}.{key}")
            elif props is not None and path != "$.metadata":
                errors.append(f"unknown field {path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            errors += _unknown_fields(value, schema["items"], f"{path}[{i}]")
    return errors


def schema_errors(manifest: dict) -> list[str]:
    import jsonschema

    filename, version = (("jobset.x-k8s.io_jobsets.yaml", "v1alpha2")
                         if manifest["kind"] == "JobSet" else ("kubeflow.org_tfjobs.yaml", "v1"))
    schema = _crd_schema(filename, version)
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
              for e in validator.iter_errors(manifest)]
    return errors + _unknown_fields(manifest, schema)


def pod_templates(manifest: dict) -> list[dict]:
    if manifest["kind"] == "JobSet":
        return [r["template"]["spec"]["template"] for r in manifest["spec"]["replicatedJobs"]]
    return [r["template"] for r in manifest["spec"]["tfReplicaSpecs"].values()]


def core_v1_errors(template: dict) -> str | None:
    import kubernetes_validate

    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template.get("metadata", {})},
           "spec": template["spec"]}
    try:
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
    except Exception as exc:  # noqa: BLE001 - its errors are several types; show any
        return str(exc)[:500]
    return None


@pytest.mark.parametrize("kind", ["jobset", "tfjob"])
@pytest.mark.parametrize("name", sorted(TOPOLOGIES))
def test_generated_manifest_validates_against_the_crd_and_core_v1(kind, name):
    manifest = job_manifest(job(kind, TOPOLOGIES[name], cpu="2", memory="4Gi"))
    assert schema_errors(manifest) == []
    for template in pod_templates(manifest):
        assert core_v1_errors(template) is None
    assert check_manifest(manifest) == manifest["kind"]  # our own rules agree


@pytest.mark.parametrize("kind", ["jobset", "tfjob"])
def test_gpus_per_task_in_limits_and_valid(kind):
    manifest = job_manifest(job(kind, gpus_per_task=2))
    assert schema_errors(manifest) == []
    for template in pod_templates(manifest):
        container = template["spec"]["containers"][0]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 2
        assert core_v1_errors(template) is None


def test_schema_check_is_not_vacuous():
    bad = job_manifest(job())
    bad["spec"]["replicatedJobs"][0]["replicas"] = "1"
    bad["spec"]["successPolicy"]["operator"] = "Most"
    bad["spec"]["typo"] = 1
    errors = " ".join(schema_errors(bad))
    assert "'1' is not of type 'integer'" in errors and "spec.typo" in errors
    assert "'Most' is not one of" in errors
    template = pod_templates(job_manifest(job()))[0]
    template["spec"]["containers"][0]["ports"][0]["containerPort"] = "2222"
    assert "'2222' is not of type 'integer'" in core_v1_errors(template)


# --------------------------------------------------------------------------- JobSet shape


def test_jobset_roles_success_and_failure_policy():
    spec = job_manifest(job(topology=Topology(workers=3, chief=True, ps=2, evaluator=True),
                            max_restarts=2))["spec"]
    jobs = {r["name"]: r["template"]["spec"] for r in spec["replicatedJobs"]}
    assert list(jobs) == ["chief", "worker", "ps", "evaluator"]
    assert {n: (s["parallelism"], s["completions"], s["completionMode"]) for n, s in jobs.items()} == {
        "chief": (1, 1, "Indexed"), "worker": (3, 3, "Indexed"), "ps": (2, 2, "Indexed"),
        "evaluator": (1, 1, "Indexed")}
    assert spec["failurePolicy"] == {"maxRestarts": 2, "rules": [
        {"name": "preemption-is-not-a-failure", "action": "RestartJobSetAndIgnoreMaxRestarts",
         "onJobFailureReasons": ["PodFailurePolicy"]}]}
    # a PS cluster is done when its chief (the coordinator) is; JobSet deletes ps/evaluator
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert spec["network"] == {"enableDNSHostnames": True, "subdomain": "mnist"}
    mwms = job_manifest(job(topology=Topology(workers=2, chief=True)))["spec"]["successPolicy"]
    assert mwms["targetReplicatedJobs"] == ["chief", "worker"]


def test_container_runs_the_script_through_the_bootstrap():
    container = job_manifest(job(keras="2"))["spec"]["replicatedJobs"][0]["template"]["spec"][
        "template"]["spec"]["containers"][0]
    assert container["name"] == "tensorflow"
    assert container["command"] == ["python", "-m", "tfrun.in_task.start.bootstrap", "train.py", "--epochs", "3"]
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}
    assert env["TF_USE_LEGACY_KERAS"] == "1" and env["TFRUN_KERAS"] == "2"
    assert env["TFRUN_K8S_ROLES"] == "worker=2"
    assert env["TFRUN_K8S_REPLICATED_JOB"] == {"fieldRef": {
        "fieldPath": "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']"}}


def test_tfjob_shape():
    spec = job_manifest(job("tfjob", Topology(workers=2, chief=True, ps=1, evaluator=True),
                            max_restarts=3))["spec"]
    assert list(spec["tfReplicaSpecs"]) == ["Chief", "Worker", "PS", "Evaluator"]
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3}
    container = spec["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["ports"][0]["name"] == "tfjob-port"


@pytest.mark.parametrize("kind", ["jobset", "tfjob"])
def test_preempted_pods_get_time_to_stop_and_restart_without_using_max_restarts(kind):
    """A pod the cluster takes away gets SIGTERM and --grace-period seconds; JobSet fails
    its Job with reason PodFailurePolicy (DisruptionTarget), which restarts the JobSet
    without counting; a TFJob restarts pods killed by a signal (ExitCode policy). The
    result still validates against the CRDs and core/v1."""
    manifest = job_manifest(job(kind, Topology(workers=2, chief=True), max_restarts=1,
                                grace_period=300))
    assert schema_errors(manifest) == []
    for template in pod_templates(manifest):
        assert template["spec"]["terminationGracePeriodSeconds"] == 300
        assert core_v1_errors(template) is None
    if kind == "jobset":
        for replicated in manifest["spec"]["replicatedJobs"]:
            assert replicated["template"]["spec"]["podFailurePolicy"] == {"rules": [
                {"action": "FailJob",
                 "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]}
        [rule] = manifest["spec"]["failurePolicy"]["rules"]
        assert rule["action"] == "RestartJobSetAndIgnoreMaxRestarts"
    else:
        assert {r["restartPolicy"] for r in manifest["spec"]["tfReplicaSpecs"].values()} == \
            {"ExitCode"}
    default = pod_templates(job_manifest(job(kind)))[0]["spec"]
    assert default["terminationGracePeriodSeconds"] == 120
    # the tasks' own grace for the agreed backup is the pod's
    for template in pod_templates(manifest):
        env = {e["name"]: e.get("value") for e in template["spec"]["containers"][0]["env"]}
        assert env["TFRUN_PREEMPTION_GRACE"] == "300"


@pytest.mark.parametrize("kind", ["jobset", "tfjob"])
def test_run_volume_keeps_the_run_directory_across_restarted_pods(kind):
    """--run-volume: every pod mounts the claim and its run directory (where the backups
    are) is named after the job, the same for every restart; without it, the pod's /tmp."""
    manifest = job_manifest(job(kind, run_volume="training-runs"))
    assert schema_errors(manifest) == []
    for template in pod_templates(manifest):
        spec = template["spec"]
        assert spec["volumes"] == [{"name": "tfrun-runs",
                                    "persistentVolumeClaim": {"claimName": "training-runs"}}]
        container = spec["containers"][0]
        assert container["volumeMounts"] == [{"name": "tfrun-runs", "mountPath": "/tfrun-runs"}]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["TFRUN_RUN_DIR"] == "/tfrun-runs/mnist"
        assert core_v1_errors(template) is None
    plain = pod_templates(job_manifest(job(kind)))[0]["spec"]
    assert "volumes" not in plain
    assert {e["name"]: e.get("value") for e in plain["containers"][0]["env"]}[
        "TFRUN_RUN_DIR"] == "/tmp/tfrun-run"


# --------------------------------------------------------------------------- TF_CONFIG in the pod


def pod_env(role, index, roles="chief=1,worker=2,ps=1,evaluator=1"):
    return {"TFRUN_K8S_ROLES": roles, "TFRUN_K8S_PORT": "2222", "TFRUN_K8S_SUBDOMAIN": "mnist",
            "TFRUN_K8S_JOBSET": "mnist", "TFRUN_K8S_REPLICATED_JOB": role,
            "TFRUN_K8S_JOB_INDEX": "0", "JOB_COMPLETION_INDEX": str(index)}


def test_every_pod_computes_the_same_cluster():
    pods = [("chief", 0), ("worker", 0), ("worker", 1), ("ps", 0), ("evaluator", 0)]
    configs = [jobset_tf_config(pod_env(r, i)).to_dict() for r, i in pods]
    assert all(c["cluster"] == configs[0]["cluster"] for c in configs)
    assert configs[0]["cluster"] == {
        "chief": ["mnist-chief-0-0.mnist:2222"],
        "worker": ["mnist-worker-0-0.mnist:2222", "mnist-worker-0-1.mnist:2222"],
        "ps": ["mnist-ps-0-0.mnist:2222"]}
    assert [c["task"] for c in configs] == [{"type": r, "index": i} for r, i in pods]
    assert jobset_tf_config({}) is None


@pytest.mark.parametrize("change, named", [
    ({"TFRUN_K8S_ROLES": "boss=1"}, "'boss=1'"),
    ({"TFRUN_K8S_REPLICATED_JOB": "launcher"}, "'launcher'"),
    ({"JOB_COMPLETION_INDEX": ""}, "JOB_COMPLETION_INDEX"),
])
def test_bad_pod_environment_is_named(change, named):
    with pytest.raises(ConfigError, match=named):
        jobset_tf_config({**pod_env("worker", 0), **change})


def test_wait_for_peers_waits_then_gives_up_naming_the_missing():
    config = jobset_tf_config(pod_env("worker", 0, roles="worker=2"))
    ready = {"mnist-worker-0-0.mnist"}
    calls = []

    def resolve(host):
        if host not in ready:
            raise OSError("no such host")

    def sleep(_):
        calls.append(1)
        ready.add("mnist-worker-0-1.mnist")

    assert wait_for_peers(config, 60, resolve=resolve, sleep=sleep) == []
    assert calls == [1]
    assert wait_for_peers(config, 0, resolve=lambda h: (_ for _ in ()).throw(OSError())) == [
        "mnist-worker-0-0.mnist", "mnist-worker-0-1.mnist"]


def test_pod_hostnames_leave_the_evaluator_out():
    assert pod_hostnames("j", "s", {"chief": 1, "evaluator": 1}) == {"chief": ["j-chief-0-0.s"]}


# --------------------------------------------------------------------------- --check


def _broken() -> list[tuple[str, dict, str]]:
    good_js, good_tf = job_manifest(job()), job_manifest(job("tfjob", Topology(workers=2, chief=True)))
    cases = []

    def case(label, base, edit, named):
        doc = copy.deepcopy(base)
        edit(doc)
        cases.append((label, doc, named))

    rjob = lambda d: d["spec"]["replicatedJobs"][0]  # noqa: E731
    pod = lambda d: rjob(d)["template"]["spec"]["template"]["spec"]  # noqa: E731
    case("jobset-wrong-role", good_js, lambda d: rjob(d).update(name="trainer"), "'trainer'")
    case("jobset-replicas-string", good_js, lambda d: rjob(d).update(replicas="1"), "not an integer")
    case("jobset-no-image", good_js, lambda d: pod(d)["containers"][0].pop("image"), "image")
    case("jobset-bad-name", good_js, lambda d: d["metadata"].update(name="MNIST_job"), "MNIST_job")
    case("jobset-not-indexed", good_js,
         lambda d: rjob(d)["template"]["spec"].update(completionMode="NonIndexed"), "Indexed")
    case("jobset-two-chiefs", job_manifest(job(topology=Topology(workers=1, chief=True))),
         lambda d: d["spec"]["replicatedJobs"][0]["template"]["spec"].update(parallelism=2,
                                                                            completions=2),
         "chief has one task")
    case("jobset-duplicate-role", good_js,
         lambda d: d["spec"]["replicatedJobs"].append(copy.deepcopy(rjob(d))), "repeats 'worker'")
    case("jobset-no-containers", good_js, lambda d: pod(d).update(containers=[]), "containers")
    case("jobset-long-name", good_js, lambda d: d["metadata"].update(name="a" * 60), "longer than 63")
    tf = lambda d: d["spec"]["tfReplicaSpecs"]  # noqa: E731
    case("tfjob-wrong-role", good_tf, lambda d: tf(d).update(Trainer=tf(d).pop("Worker")), "Trainer")
    case("tfjob-two-chiefs", good_tf, lambda d: tf(d).update(Master=copy.deepcopy(tf(d)["Chief"])),
         "both Chief and Master")
    case("tfjob-chief-replicas", good_tf, lambda d: tf(d)["Chief"].update(replicas=2), "at most 1 chief")
    case("tfjob-replicas-string", good_tf, lambda d: tf(d)["Worker"].update(replicas="2"),
         "not an integer")
    case("tfjob-container-name", good_tf,
         lambda d: tf(d)["Worker"]["template"]["spec"]["containers"][0].update(name="main"),
         "no container named 'tensorflow'")
    case("tfjob-no-image", good_tf,
         lambda d: tf(d)["Worker"]["template"]["spec"]["containers"][0].update(image=""), "image")
    case("tfjob-restart-policy", good_tf, lambda d: tf(d)["Worker"].update(restartPolicy="Exitcode"),
         "'Exitcode', which training-operator does not know")
    case("wrong-kind", good_tf, lambda d: d.update(kind="PyTorchJob"), "PyTorchJob")
    return cases


BROKEN = _broken()


@pytest.mark.parametrize("label, doc, named", BROKEN, ids=[c[0] for c in BROKEN])
def test_check_rejects_a_broken_manifest_with_one_clear_paragraph(label, doc, named, tmp_path, capsys):
    path = tmp_path / f"{label}.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["k8s", "--check", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tfrun: error:") and "\n" not in err
    assert named in err and "Expected" in err and "Fix:" in err and "Received:" in err


def test_at_least_ten_broken_manifests():
    assert len(BROKEN) >= 10


def test_check_accepts_generated_manifests_and_names_bad_yaml(tmp_path, capsys):
    good = tmp_path / "job.yaml"
    assert main(["k8s", "--image", "img:1", "--chief", "--workers", "2", "--ps", "1", "train.py"]) == 0
    good.write_text(capsys.readouterr().out)
    assert main(["k8s", "--check", str(good)]) == 0
    assert "JobSet train: ok" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: JobSet\n  spec: [\n")
    assert main(["k8s", "--check", str(bad)]) == 2
    assert "is not valid YAML (line" in capsys.readouterr().err


def test_cli_prints_yaml_for_both_kinds(capsys):
    assert main(["k8s", "--image", "img:1", "--kind", "tfjob", "--name", "demo", "--workers", "2",
                 "-m", "pkg.train", "--lr", "0.1"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    assert doc["kind"] == "TFJob" and doc["metadata"]["name"] == "demo"
    container = doc["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert container["command"][-4:] == ["-m", "pkg.train", "--lr", "0.1"]


@pytest.mark.parametrize("argv, named", [
    (["k8s", "train.py"], "--image"),
    (["k8s", "--image", "i", "--name", "Bad_Name", "train.py"], "'Bad_Name'"),
    (["k8s", "--image", "i", "--env", "NOVALUE", "train.py"], "'NOVALUE'"),
    (["k8s", "--image", "i", "--hosts", "a,b", "train.py"], "--hosts"),
    (["k8s", "--check", "/nonexistent/job.yaml"], "/nonexistent/job.yaml"),
])
def test_cli_bad_input(argv, named, capsys):
    assert main(argv) == 2
    assert named in capsys.readouterr().err


def test_json_manifest_is_read_too(tmp_path, capsys):
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_manifest(job())))
    assert main(["k8s", "--check", str(path)]) == 0


# --------------------------------------------------------------------------- the bootstrap in a pod


def _bootstrap(tmp_path, env: dict) -> subprocess.CompletedProcess:
    script = tmp_path / "show.py"
    script.write_text("import os; print('TF_CONFIG=' + os.environ.get('TF_CONFIG', ''))\n")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("TF_CONFIG", "TFRUN_"))}
    return subprocess.run([sys.executable, "-m", "tfrun.in_task.start.bootstrap", str(script)],
                          env={**clean, **env}, capture_output=True, text=True, timeout=120)


def test_bootstrap_in_a_jobset_pod_sets_tf_config(tmp_path):
    env = {**pod_env("worker", 1, roles="worker=2"), "TFRUN_K8S_SUBDOMAIN": "localhost",
           "TFRUN_K8S_DNS_TIMEOUT": "0"}
    result = _bootstrap(tmp_path, env)
    # the peers' names do not resolve here: the pod says which, and exits 1
    assert result.returncode == 1
    assert "mnist-worker-0-0.localhost" in result.stderr and "never resolved" in result.stderr
    bad = _bootstrap(tmp_path, {**env, "TFRUN_K8S_ROLES": "boss=1"})
    assert bad.returncode == 2 and "'boss=1'" in bad.stderr


def test_bootstrap_in_a_tfjob_pod_normalises_master(tmp_path):
    raw = json.dumps({"cluster": {"master": ["a:1"], "worker": ["b:1"]},
                      "task": {"type": "master", "index": 0}})
    result = _bootstrap(tmp_path, {"TFRUN_K8S_KIND": "tfjob", "TF_CONFIG": raw})
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout.split("TF_CONFIG=", 1)[1])
    assert shown == {"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                     "task": {"type": "chief", "index": 0}}
    untouched = _bootstrap(tmp_path, {"TF_CONFIG": raw})  # outside a TFJob pod: as given
    assert json.loads(untouched.stdout.split("TF_CONFIG=", 1)[1]) == json.loads(raw)


README_COMMANDS = ("tfrun k8s --image registry.example.com/train:1 --workers 2 "
                   "examples/mnist_mlp.py > job.yaml",
                   "tfrun k8s --image registry.example.com/train:1 --workers 2 --run-volume "
                   "runs train.py > job.yaml")


@pytest.mark.parametrize("command, name", list(zip(README_COMMANDS, ("mnist-mlp", "train"))))
def test_readme_k8s_command_runs_as_written_and_its_manifest_validates(tmp_path, command,
                                                                        name):
    readme = (Path(__file__).resolve().parents[2] / "docs" / "kubernetes.md").read_text()
    assert command in readme and "kubectl apply -f job.yaml" in readme
    (tmp_path / "train.py").write_text("")
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    manifest = yaml.safe_load((tmp_path / "job.yaml").read_text())
    assert manifest["kind"] == "JobSet" and manifest["metadata"]["name"] == name
    assert schema_errors(manifest) == []  # what kubectl apply's validation would check
    assert main(["k8s", "--check", str(tmp_path / "job.yaml")]) == 0
    if "--run-volume" in command:  # the pods' run dir on the claim, as the page says
        pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert pod["volumes"] == [{"name": "tfrun-runs",
                                   "persistentVolumeClaim": {"claimName": "runs"}}]
