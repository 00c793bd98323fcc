"""The Kubernetes engine: a tfrun cluster as a JobSet (default) or TFJob manifest; TF_CONFIG made in the pod.

``tfrun k8s --image IMG --workers 2 train.py > job.yaml`` prints the manifest
(``job_manifest``); ``tfrun k8s --check job.yaml`` checks one offline (``check_manifest``).

JobSet (``jobset.x-k8s.io/v1alpha2``): one replicated job per role (chief, worker, ps,
evaluator), each a single Indexed Job whose pods are that role's tasks (the pod's
``JOB_COMPLETION_INDEX`` is the task index). With DNS hostnames on, the pods are
``<jobset>-<role>-0-<index>.<subdomain>``; every pod's container runs the script through
``python -m tfrun.in_task.start.bootstrap``, which builds TF_CONFIG from the labels JobSet puts on the
pod (read through the downward API) and the role counts in ``contract.K8S_ROLES``
(``tfrun.in_task.start.pod.jobset_tf_config``), identically in every pod, and waits until every peer's DNS name
resolves before training starts. ``failurePolicy.maxRestarts`` is the gang restart; the
``successPolicy`` ends the JobSet when the tracked roles (chief/workers, or the chief of
a parameter-server cluster) succeed, and JobSet then deletes the ps/evaluator jobs.

TFJob (``kubeflow.org/v1``, training-operator v1): the operator writes TF_CONFIG; the
bootstrap normalises its dialect (``master`` -> ``chief``) and uses it as is.

Pure: dicts in, dicts out (``render_yaml`` / ``load_manifests`` are the only YAML).

    >>> manifest = job_manifest(K8sJob(name="mnist", image="me/train:1",
    ...                                command=("train.py",), topology=Topology(workers=2)))
    >>> manifest["kind"], [r["name"] for r in manifest["spec"]["replicatedJobs"]]
    ('JobSet', ['worker'])
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ... import contract
from ...cluster import Topology
from ...errors import ConfigError
from ...in_task.start.pod import ROLES
from ..config import STRATEGIES
from ...flags import add_topology_flags, non_negative_int, split_module, topology_from
from .base import Engine, Subcommand

__all__ = ["JOBSET_API", "TFJOB_API", "K8sJob", "KubernetesEngine", "check_manifest", "job_manifest",
           "load_manifests", "render_yaml"]

JOBSET_API = "jobset.x-k8s.io/v1alpha2"
TFJOB_API = "kubeflow.org/v1"
KINDS = ("jobset", "tfjob")
#: TFJob's replica type for each tfrun role (training-operator v1 spelling).
TFJOB_TYPES = {"chief": "Chief", "worker": "Worker", "ps": "PS", "evaluator": "Evaluator"}
_TFJOB_ACCEPTED = ("Chief", "Master", "Worker", "PS", "Evaluator")
#: Kubernetes' resource.Quantity: a signed decimal with an optional binary (Ki..Ei),
#: decimal (n, u, m, k, M..E) or exponent suffix.
_QUANTITY = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([numkMGTPE]|[KMGTPE]i|[eE][+-]?\d+)?")
_TFJOB_RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
#: Where --run-volume's claim is mounted in every pod.
RUN_VOLUME_MOUNT = "/tfrun-runs"
DEFAULT_GRACE_PERIOD = 120
CONTAINER = "tensorflow"   # TFJob requires this container name; JobSet pods use it too
_DNS_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL = "jobset.sigs.k8s.io/"


@dataclass(frozen=True)
class K8sJob:
    """What ``tfrun k8s`` turns into a manifest.

    ``command``: what follows ``python -m tfrun.in_task.start.bootstrap`` (``train.py args`` or
    ``-m module args``). ``cpu``/``memory``: Kubernetes quantities per task ("2", "4Gi").
    """

    name: str
    image: str
    command: tuple[str, ...]
    topology: Topology = field(default_factory=Topology)
    kind: str = "jobset"
    namespace: str | None = None
    port: int = 2222
    cpu: str | None = None
    memory: str | None = None
    gpus_per_task: int = 0
    max_restarts: int = 0
    keras: str = "3"
    strategy: str = "auto"
    roles: str = "auto"
    env: tuple[tuple[str, str], ...] = ()
    python: str = "python"
    dns_timeout: float = 300.0
    #: seconds a pod has between SIGTERM (eviction, preemption) and SIGKILL to stop and save
    grace_period: int = DEFAULT_GRACE_PERIOD
    #: a PersistentVolumeClaim for the run directory (backups survive a restarted pod)
    run_volume: str | None = None

    @property
    def run_dir(self) -> str:
        """The run directory in every pod: on the claim, named after the job, when there
        is one (the same for every restart of the job); else the pod's own /tmp."""
        return f"{RUN_VOLUME_MOUNT}/{self.name}" if self.run_volume else "/tmp/tfrun-run"

    def __post_init__(self) -> None:
        _check_name(self.name, "--name", longest_suffix=len("-evaluator-0-") + 4)
        if self.kind not in KINDS:
            raise ConfigError(f"Unknown manifest kind {self.kind!r}", expected="jobset or tfjob",
                              fix="Pass --kind jobset (default) or --kind tfjob",
                              received=repr(self.kind))
        if not self.image.strip():
            raise ConfigError("No container image", expected="the image that has your script, "
                              "TensorFlow and tfrun", fix="Pass --image registry/train:tag",
                              received=repr(self.image))
        if not self.command:
            raise ConfigError("Nothing to run", expected="a script (or -m module)",
                              fix="Call e.g. tfrun k8s --image IMG train.py", received=self.command)
        if self.namespace is not None:
            _check_name(self.namespace, "--namespace", dns1123=True)
        if not 1 <= self.port <= 65535:
            raise ConfigError("--port is not a port", expected="1..65535",
                              fix="Pass e.g. --port 2222", received=self.port)
        for flag, value in (("--cpu", self.cpu), ("--memory", self.memory)):
            if value is not None and not _QUANTITY.fullmatch(str(value)):
                raise ConfigError(f"{flag} {value!r} is not a Kubernetes quantity",
                                  expected="a number with an optional suffix, e.g. 4, 500m, "
                                           "8Gi, 1.5", fix=f"Pass e.g. {flag} "
                                  f"{'2' if flag == '--cpu' else '8Gi'}", received=repr(value))
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"Unknown strategy {self.strategy!r}",
                              expected=f"one of {', '.join(STRATEGIES)}",
                              fix="Pass e.g. --strategy auto", received=repr(self.strategy))
        if self.gpus_per_task < 0 or self.max_restarts < 0:
            raise ConfigError("--gpus-per-task and --max-restarts cannot be negative",
                              expected="0 or more", fix="Pass e.g. --gpus-per-task 1",
                              received=(self.gpus_per_task, self.max_restarts))

    def counts(self) -> dict[str, int]:
        """Tasks per role, in ``ROLES`` order, roles with none left out."""
        t = self.topology
        counts = {"chief": int(t.chief), "worker": t.workers, "ps": t.ps,
                  "evaluator": int(t.evaluator)}
        return {role: n for role, n in counts.items() if n}

    def tracked_roles(self) -> list[str]:
        """The roles whose success is the job's (tfrun's LaunchConfig.tracked)."""
        counts = self.counts()
        if counts.get("ps") and counts.get("chief"):
            return ["chief"]
        return [r for r in ("chief", "worker") if r in counts]


def _check_name(name: str, flag: str, *, longest_suffix: int = 0, dns1123: bool = False) -> None:
    pattern = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?") if dns1123 else _DNS_1035
    limit = 63 - longest_suffix
    if not isinstance(name, str) or not pattern.fullmatch(name) or len(name) > limit:
        raise ConfigError(f"{flag} {name!r} is not a valid Kubernetes name",
                          expected=f"lower-case letters, digits and '-', starting with a "
                                   f"{'letter or digit' if dns1123 else 'letter'}, ending with "
                                   f"a letter or digit, at most {limit} characters"
                                   + (" (pod host names add '-<role>-0-<index>')"
                                      if longest_suffix else ""),
                          fix=f"Pass e.g. {flag} mnist-train", received=repr(name))


# --------------------------------------------------------------------------- manifests


def job_manifest(job: K8sJob) -> dict:
    """The JobSet or TFJob manifest for ``job`` (a plain dict, ready for ``render_yaml``)."""
    return _jobset(job) if job.kind == "jobset" else _tfjob(job)


def _metadata(job: K8sJob) -> dict:
    meta: dict[str, Any] = {"name": job.name, "labels": {"app.kubernetes.io/managed-by": "tfrun"}}
    if job.namespace:
        meta["namespace"] = job.namespace
    return meta


def _common_env(job: K8sJob) -> list[dict]:
    from ..specs import script_env  # the same contract as a launch's tasks

    env = script_env(strategy=job.strategy, keras=job.keras, roles=job.roles,
                     run_dir=job.run_dir)
    if job.grace_period:
        # The pod's own notice: its tasks' agreed backup must fit in what Kubernetes gives
        # between SIGTERM and SIGKILL.
        env[contract.PREEMPTION_GRACE] = str(job.grace_period)
    env.update(dict(job.env))
    return [{"name": k, "value": v} for k, v in env.items()]


def _container(job: K8sJob, env: list[dict]) -> dict:
    container: dict[str, Any] = {
        "name": CONTAINER, "image": job.image,
        "command": [job.python, "-m", "tfrun.in_task.start.bootstrap", *job.command],
        "env": env,
        "ports": [{"name": "tfjob-port" if job.kind == "tfjob" else "tfrun",
                   "containerPort": job.port, "protocol": "TCP"}],
    }
    limits: dict[str, Any] = {}
    if job.cpu:
        limits["cpu"] = job.cpu
    if job.memory:
        limits["memory"] = job.memory
    if job.gpus_per_task:
        limits["nvidia.com/gpu"] = job.gpus_per_task
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    if job.run_volume:
        container["volumeMounts"] = [{"name": "tfrun-runs", "mountPath": RUN_VOLUME_MOUNT}]
    return container


def _pod_spec(job: K8sJob, env: list[dict]) -> dict:
    spec: dict[str, Any] = {"restartPolicy": "Never",
                            # SIGTERM first (eviction, preemption): time for the tasks to
                            # stop and save before the kubelet's SIGKILL.
                            "terminationGracePeriodSeconds": job.grace_period,
                            "containers": [_container(job, env)]}
    if job.run_volume:
        spec["volumes"] = [{"name": "tfrun-runs",
                            "persistentVolumeClaim": {"claimName": job.run_volume}}]
    return spec


def _downward(name: str, label: str) -> dict:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath":
                                                     f"metadata.labels['{_LABEL}{label}']"}}}


def _jobset(job: K8sJob) -> dict:
    counts = job.counts()
    roles_env = ",".join(f"{role}={n}" for role, n in counts.items())
    env = _common_env(job) + [
        {"name": contract.K8S_ROLES, "value": roles_env},
        {"name": contract.K8S_PORT, "value": str(job.port)},
        {"name": contract.K8S_SUBDOMAIN, "value": job.name},
        {"name": contract.K8S_DNS_TIMEOUT, "value": f"{job.dns_timeout:g}"},
        _downward(contract.K8S_JOBSET, "jobset-name"),
        _downward(contract.K8S_REPLICATED_JOB, "replicatedjob-name"),
        _downward(contract.K8S_JOB_INDEX, "job-index"),
    ]
    replicated = []
    for role, n in counts.items():
        replicated.append({"name": role, "replicas": 1, "template": {"spec": {
            "parallelism": n, "completions": n, "completionMode": "Indexed",
            "backoffLimit": 0,  # a failed pod fails its job: JobSet's failurePolicy decides
            # A pod the cluster took away (preemption, eviction, a drained node) fails its
            # Job with reason PodFailurePolicy, which the JobSet rule below restarts for free.
            "podFailurePolicy": {"rules": [{"action": "FailJob", "onPodConditions": [
                {"type": "DisruptionTarget", "status": "True"}]}]},
            "template": {"metadata": {"labels": {"app.kubernetes.io/managed-by": "tfrun"}},
                         "spec": _pod_spec(job, env)}}}})
    return {"apiVersion": JOBSET_API, "kind": "JobSet", "metadata": _metadata(job), "spec": {
        "network": {"enableDNSHostnames": True, "subdomain": job.name},
        # Preemptions do not use up --max-restarts; the script's own failures do.
        "failurePolicy": {"maxRestarts": job.max_restarts, "rules": [
            {"name": "preemption-is-not-a-failure", "action": "RestartJobSetAndIgnoreMaxRestarts",
             "onJobFailureReasons": ["PodFailurePolicy"]}]},
        # Done when the tracked roles succeed; JobSet then deletes the ps/evaluator jobs.
        "successPolicy": {"operator": "All", "targetReplicatedJobs": job.tracked_roles()},
        "replicatedJobs": replicated}}


def _tfjob(job: K8sJob) -> dict:
    env = _common_env(job) + [{"name": contract.K8S_KIND, "value": "tfjob"}]
    specs = {}
    for role, n in job.counts().items():
        pod = _pod_spec(job, env)
        del pod["restartPolicy"]  # the replica's restartPolicy decides (training-operator)
        specs[TFJOB_TYPES[role]] = {
            # ExitCode: a pod killed by a signal (exit 128+: SIGTERM on preemption, SIGKILL)
            # is restarted; the script's own errors (1-127) are not.
            "replicas": n, "restartPolicy": "ExitCode", "template": {"spec": pod}}
    return {"apiVersion": TFJOB_API, "kind": "TFJob", "metadata": _metadata(job), "spec": {
        # Running: ps/evaluator pods still running when training ends are deleted
        # (kubeflow/trainer#774: they never exit by themselves).
        "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": job.max_restarts},
        "tfReplicaSpecs": specs}}


# --------------------------------------------------------------------------- --check


def check_manifest(doc: Any, where: str = "manifest") -> str:
    """Check one manifest as the operators' webhooks would; return its kind, or raise a
    ConfigError naming the field, what is wrong and the fix."""
    if not isinstance(doc, dict):
        _bad(where, "is not a mapping", "a Kubernetes object (apiVersion, kind, metadata, spec)",
             doc)
    kind = doc.get("kind")
    api = doc.get("apiVersion")
    if (kind, api) not in (("JobSet", JOBSET_API), ("TFJob", TFJOB_API)):
        _bad(f"{where}: apiVersion/kind", "is not a JobSet or TFJob",
             f"apiVersion {JOBSET_API} kind JobSet, or {TFJOB_API} kind TFJob", f"{api} {kind}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str):
        _bad(f"{where}: metadata.name", "is missing", "a name", meta)
    name = meta["name"]
    if not _DNS_1035.fullmatch(name) or len(name) > 63:
        _bad(f"{where}: metadata.name", "is not a DNS-1035 label",
             "lower-case letters, digits and '-', starting with a letter, at most 63", name)
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        _bad(f"{where}: spec", "is missing", "a spec", spec)
    if kind == "TFJob":
        _check_tfjob(spec, where)
    else:
        _check_jobset(spec, name, where)
    return kind


def _bad(path: str, what: str, expected: str, received: Any) -> None:
    raise ConfigError(f"{path} {what}", expected=expected,
                      fix="Fix it, or regenerate the manifest with tfrun k8s",
                      received=received if isinstance(received, str) else repr(received)[:200])


def _replicas(value: Any, path: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _bad(path, f"is {type(value).__name__} {value!r}, not an integer",
             "an integer (replicas: 2, not \"2\")", value)
    if value < low:
        _bad(path, f"is {value}", f"{low} or more", value)
    return value


def _check_pod(template: Any, path: str, *, need_tensorflow: bool) -> None:
    spec = template.get("spec") if isinstance(template, dict) else None
    containers = spec.get("containers") if isinstance(spec, dict) else None
    if not isinstance(containers, list) or not containers:
        _bad(f"{path}.spec.containers", "is missing or empty", "at least one container",
             containers)
    names = [c.get("name") if isinstance(c, dict) else None for c in containers]
    if need_tensorflow and CONTAINER not in names:
        _bad(f"{path}.spec.containers", f"has no container named {CONTAINER!r}",
             f"the training container named {CONTAINER!r} (training-operator finds it by name)",
             names)
    for i, c in enumerate(containers):
        if not isinstance(c, dict) or not str(c.get("image") or "").strip():
            _bad(f"{path}.spec.containers[{i}].image", "is missing", "an image", c)
        resources = c.get("resources") if isinstance(c.get("resources"), dict) else {}
        for kind in ("limits", "requests"):
            amounts = resources.get(kind) if isinstance(resources.get(kind), dict) else {}
            for resource, amount in amounts.items():
                if not _QUANTITY.fullmatch(str(amount)):
                    _bad(f"{path}.spec.containers[{i}].resources.{kind}.{resource}",
                         "is not a Kubernetes quantity", "e.g. 4, 500m, 8Gi", amount)
        for entry in c.get("env") or []:
            if isinstance(entry, dict) and entry.get("name") == contract.STRATEGY \
                    and entry.get("value") not in STRATEGIES:
                _bad(f"{path}.spec.containers[{i}].env[{contract.STRATEGY}]",
                     "names no strategy", f"one of {', '.join(STRATEGIES)}", entry.get("value"))


def _check_tfjob(spec: dict, where: str) -> None:
    replica_specs = spec.get("tfReplicaSpecs")
    if not isinstance(replica_specs, dict) or not replica_specs:
        _bad(f"{where}: spec.tfReplicaSpecs", "is missing", "Chief/Worker/PS/Evaluator entries",
             replica_specs)
    leaders = 0
    for key, rspec in replica_specs.items():
        path = f"{where}: spec.tfReplicaSpecs.{key}"
        if key not in _TFJOB_ACCEPTED:
            _bad(path, "is not a TFJob replica type", ", ".join(_TFJOB_ACCEPTED), key)
        if not isinstance(rspec, dict):
            _bad(path, "is not a mapping", "replicas, restartPolicy, template", rspec)
        n = _replicas(rspec.get("replicas", 1), f"{path}.replicas")
        policy = rspec.get("restartPolicy", "Never")
        if policy not in _TFJOB_RESTART_POLICIES:  # the CRD's schema does not list them
            _bad(f"{path}.restartPolicy", f"is {policy!r}, which training-operator does not know",
                 ", ".join(_TFJOB_RESTART_POLICIES) + " (ExitCode: restart pods killed by a "
                 "signal, as on preemption)", policy)
        if key in ("Chief", "Master"):
            leaders += 1
            if n > 1:
                _bad(f"{path}.replicas", f"is {n}", "at most 1 chief", n)
        if key == "Evaluator" and n > 1:
            _bad(f"{path}.replicas", f"is {n}", "at most 1 evaluator", n)
        _check_pod(rspec.get("template"), f"{path}.template", need_tensorflow=True)
    if leaders > 1:
        _bad(f"{where}: spec.tfReplicaSpecs", "has both Chief and Master", "one chief",
             sorted(replica_specs))


def _check_jobset(spec: dict, name: str, where: str) -> None:
    jobs = spec.get("replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        _bad(f"{where}: spec.replicatedJobs", "is missing or empty", "one entry per role", jobs)
    seen = set()
    for i, rjob in enumerate(jobs):
        path = f"{where}: spec.replicatedJobs[{i}]"
        if not isinstance(rjob, dict):
            _bad(path, "is not a mapping", "name, replicas, template", rjob)
        rname = rjob.get("name")
        if not isinstance(rname, str) or not _DNS_1035.fullmatch(rname):
            _bad(f"{path}.name", "is not a DNS-1035 label", "e.g. worker", rname)
        if rname in seen:
            _bad(f"{path}.name", f"repeats {rname!r}", "distinct replicated job names", rname)
        seen.add(rname)
        if rname not in ROLES:
            _bad(f"{path}.name", f"{rname!r} is not a tfrun role",
                 f"one of {', '.join(ROLES)} (the pod's TF_CONFIG role)", rname)
        replicas = _replicas(rjob.get("replicas", 1), f"{path}.replicas", low=1)
        if replicas != 1:
            _bad(f"{path}.replicas", f"is {replicas}",
                 "1 (a role's tasks are the pods of one Indexed Job: use parallelism)", replicas)
        job_spec = (rjob.get("template") or {}).get("spec") if isinstance(rjob.get("template"),
                                                                            dict) else None
        if not isinstance(job_spec, dict):
            _bad(f"{path}.template.spec", "is missing", "a Job spec", job_spec)
        parallelism = _replicas(job_spec.get("parallelism", 1), f"{path}.template.spec.parallelism",
                                low=1)
        completions = _replicas(job_spec.get("completions", parallelism),
                                f"{path}.template.spec.completions", low=1)
        if completions != parallelism or job_spec.get("completionMode") != "Indexed":
            _bad(f"{path}.template.spec", "is not an Indexed Job with completions = parallelism",
                 "completionMode: Indexed, completions equal to parallelism (one pod per task)",
                 {k: job_spec.get(k) for k in ("parallelism", "completions", "completionMode")})
        if rname in ("chief", "evaluator") and parallelism > 1:
            _bad(f"{path}.template.spec.parallelism", f"is {parallelism}",
                 f"1 ({rname} has one task)", parallelism)
        longest = f"{name}-{rname}-0-{parallelism - 1}"
        if len(longest) > 63:
            _bad(f"{path}", f"makes pod host names like {longest!r}, longer than 63",
                 "a shorter JobSet name", longest)
        _check_pod(job_spec.get("template"), f"{path}.template.spec.template",
                   need_tensorflow=False)
    if "worker" not in seen and "chief" not in seen:
        _bad(f"{where}: spec.replicatedJobs", "has no chief and no worker", "a worker job",
             sorted(seen))


# --------------------------------------------------------------------------- YAML


def render_yaml(manifest: dict) -> str:
    import yaml

    return yaml.safe_dump(manifest, sort_keys=False, default_flow_style=False)


def load_manifests(text: str, source: str) -> list[Any]:
    """Every document of a YAML (or JSON) file; a ConfigError naming the line if unreadable."""
    import yaml

    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ConfigError(f"{source} is not valid YAML{where}",
                          expected="a JobSet or TFJob manifest", fix="Fix the YAML syntax",
                          received=str(exc).splitlines()[0]) from None


class KubernetesEngine(Engine):
    """``tfrun k8s``: the cluster as a manifest; Kubernetes runs it (``kubectl apply``)."""

    name = "kubernetes"
    runs_tasks = False

    @classmethod
    def subcommands(cls) -> tuple[Subcommand, ...]:
        return (Subcommand("k8s", "tfrun k8s --image IMG [...]     (a JobSet/TFJob manifest)",
                           _run_k8s),)

    def run(self, plan):
        raise ConfigError("Kubernetes runs a manifest, not a launch", expected="tfrun k8s ...",
                          fix="Print the manifest with tfrun k8s and kubectl apply it",
                          received="a launch on the kubernetes engine")


# --------------------------------------------------------------------------- tfrun k8s


def _build_k8s_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfrun k8s",
        usage="tfrun k8s --image IMAGE [options] [topology flags] (script.py | -m module) [args]\n"
              "       tfrun k8s --check job.yaml",
        description="Print a Kubernetes manifest for a tfrun cluster: a JobSet (default) or a "
                    "TFJob. Every pod runs the script through tfrun's bootstrap, which makes "
                    "TF_CONFIG from what JobSet gives the pod (TFJob: the operator's, normalised).",
        epilog="examples:\n"
               "  tfrun k8s --image registry/train:1 --workers 2 train.py > job.yaml\n"
               "  kubectl apply -f job.yaml\n"
               "  tfrun k8s --check job.yaml",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_topology_flags(parser, hosts=False)
    parser.add_argument("--check", default=None, metavar="FILE",
                        help="check a JobSet/TFJob manifest offline (exit 2 with the reason)")
    parser.add_argument("--image", default=None, help="container image with the script, "
                        "TensorFlow and tfrun")
    parser.add_argument("--kind", choices=("jobset", "tfjob"), default="jobset",
                        help="jobset (default, jobset.x-k8s.io) or tfjob (kubeflow.org/v1)")
    parser.add_argument("--name", default=None, help="job name (default: from the script)")
    parser.add_argument("--namespace", default=None)
    parser.add_argument("--port", type=int, default=2222, help="TensorFlow port in every pod")
    parser.add_argument("--cpu", default=None, help="CPU per task, e.g. 4")
    parser.add_argument("--memory", default=None, help="memory per task, e.g. 8Gi")
    parser.add_argument("--gpus-per-task", type=non_negative_int, default=0)
    parser.add_argument("--max-restarts", type=non_negative_int, default=0,
                        help="gang restarts (JobSet failurePolicy.maxRestarts; TFJob backoffLimit)")
    parser.add_argument("--grace-period", type=non_negative_int, default=DEFAULT_GRACE_PERIOD,
                        help="seconds between a pod's SIGTERM (eviction, preemption) and SIGKILL "
                             f"(terminationGracePeriodSeconds; default {DEFAULT_GRACE_PERIOD})")
    parser.add_argument("--run-volume", default=None, metavar="CLAIM",
                        help="a PersistentVolumeClaim for the run directory "
                             f"({RUN_VOLUME_MOUNT}/<name>): backups survive restarted pods, so a "
                             "restarted job resumes (default: the pod's /tmp, lost on restart)")
    parser.add_argument("--keras", choices=("3", "2"), default="3")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--roles", choices=("auto", "script"), default="auto")
    parser.add_argument("--env", action="append", default=None, metavar="NAME=VALUE",
                        help="an environment variable for every pod (repeatable)")
    parser.add_argument("--python", default="python", help="the Python in the image")
    parser.add_argument("-m", dest="module", default=None, help="run a module, like python -m")
    parser.add_argument("target", nargs="?", help=argparse.SUPPRESS)
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def _default_job_name(target: str) -> str:
    stem = target.rsplit("/", 1)[-1].removesuffix(".py").rsplit(".", 1)[-1]
    name = re.sub(r"[^a-z0-9-]+", "-", stem.lower()).strip("-")
    return (name if name[:1].isalpha() else f"tf-{name}")[:40].rstrip("-") or "tfrun-job"


def _run_k8s(argv: Sequence[str], parse_launch=None) -> int:
    """``tfrun k8s ...``: print a manifest, or check one (``--check``)."""
    parser = _build_k8s_parser()
    own, module_args = split_module(parser, list(argv))
    args = parser.parse_args(own)
    if args.hosts is not None or args.layout != "default":
        raise ConfigError("tfrun k8s places the tasks in pods, named by Kubernetes",
                          expected="no --hosts/--layout", fix="Drop --hosts/--layout",
                          received=f"--hosts {','.join(args.hosts or [])} --layout {args.layout}")
    if args.check is not None:
        try:
            text = open(args.check, encoding="utf-8").read()
        except OSError as exc:
            raise ConfigError(f"Cannot read {args.check}: {exc.strerror}",
                              expected="a manifest file", fix="Check the path",
                              received=args.check) from None
        docs = load_manifests(text, args.check)
        if not docs:
            raise ConfigError(f"{args.check} has no manifest in it", expected="a JobSet or TFJob",
                              fix="Pass the file tfrun k8s wrote", received=args.check)
        for i, doc in enumerate(docs):
            kind = check_manifest(doc, f"{args.check} (document {i + 1})" if len(docs) > 1
                                  else args.check)
            print(f"{args.check}: {kind} {doc['metadata']['name']}: ok")
        return 0
    if args.module:
        command = ("-m", args.module, *([args.target] if args.target else []), *args.args,
                   *module_args)
        target = args.module
    elif args.target:
        command, target = (args.target, *args.args), args.target
    else:
        parser.print_usage(sys.stderr)
        raise ConfigError("No script given", expected="a script path (inside the image) or -m "
                          "module", fix="Call e.g. tfrun k8s --image IMG train.py",
                          received=list(argv))
    if not args.image:
        raise ConfigError("tfrun k8s needs --image", expected="the image that has the script, "
                          "TensorFlow and tfrun", fix="Pass e.g. --image registry/train:1",
                          received="no --image")
    env = []
    for entry in args.env or []:
        key, sep, value = entry.partition("=")
        if not sep or not key.isidentifier():
            raise ConfigError(f"--env {entry!r} is not NAME=VALUE", expected="NAME=VALUE",
                              fix="Pass e.g. --env WANDB_MODE=offline", received=repr(entry))
        env.append((key, value))
    job = K8sJob(name=args.name or _default_job_name(target), image=args.image,
                 command=tuple(command), topology=topology_from(args), kind=args.kind,
                 namespace=args.namespace, port=args.port, cpu=args.cpu, memory=args.memory,
                 gpus_per_task=args.gpus_per_task, max_restarts=args.max_restarts,
                 keras=args.keras, strategy=args.strategy, roles=args.roles, env=tuple(env),
                 python=args.python, grace_period=args.grace_period, run_volume=args.run_volume)
    print(render_yaml(job_manifest(job)), end="")
    return 0
