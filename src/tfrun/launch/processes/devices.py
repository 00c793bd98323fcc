"""Devices per task on this machine: disjoint GPUs and CPU sets for local tasks (pure).

``--gpus-per-task G`` gives each task that computes (the chief and workers of a
MultiWorkerMirrored cluster, the workers of a parameter-server cluster, then the evaluator
while GPUs are left) G GPUs of its own through ``CUDA_VISIBLE_DEVICES``; the other tasks
(parameter servers, a PS coordinator) get none, so that TensorFlow does not reserve memory
on every GPU in each of them. Without the flag, a machine with several GPUs, at least one
per training task, gives each training task one GPU (``tfrun.strategy()`` then all-reduces
across workers with NCCL, TensorFlow's choice for GPUs). ``--cpus-per-task C``
pins every task to C CPUs of its own (``contract.CPUS``, applied by the task's bootstrap
before TensorFlow starts) and sizes TensorFlow's intra-op thread pool to match. Without
the flag, a MultiWorkerMirrored cluster (no ps) of at least two tasks and at most one task
per CPU splits the CPUs evenly the same way: each task otherwise sizes TensorFlow's thread
pools for the whole machine, and the tasks' threads fight over every core (measured,
``benchmarks/bench_scaling.py``: 2 workers on 2 cores, 0.78 scaling efficiency pinned
against 0.63 sharing). ``--cpus-per-task 0`` lets the tasks share every CPU.

The GPUs are the ones this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else those
the NVIDIA driver lists. The CPUs are this process's affinity.

    >>> from tfrun.cluster import TaskId
    >>> tasks = [TaskId("worker", 0), TaskId("worker", 1)]
    >>> shares = share_devices(tasks, gpus=["0", "1", "2", "3"], cpus=[0, 1],
    ...                        gpus_per_task=None, cpus_per_task=1, ps_cluster=False)
    >>> env = shares[tasks[1]].env()
    >>> env["CUDA_VISIBLE_DEVICES"], env[contract.CPUS], env["TF_NUM_INTRAOP_THREADS"], len(env)
    ('1', '1', '1', 3)
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Sequence

from ... import contract
from ...cluster import TaskId
from ...errors import ConfigError

__all__ = ["CPUS_ENV", "DeviceShare", "describe_shares", "local_shares", "share_devices",
           "visible_gpus"]

#: The CPUs a task is pinned to ("0,1"), set by the launcher, applied by the bootstrap.
CPUS_ENV = contract.CPUS
_NVIDIA_GPUS = "/proc/driver/nvidia/gpus"


@dataclass(frozen=True)
class DeviceShare:
    """What one task may use; None: left as the machine gives it."""

    gpus: tuple[str, ...] | None = None
    cpus: tuple[int, ...] | None = None

    def env(self) -> dict[str, str]:
        env: dict[str, str] = {}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpus)
        if self.cpus is not None:
            env[CPUS_ENV] = ",".join(map(str, self.cpus))
            env["TF_NUM_INTRAOP_THREADS"] = str(len(self.cpus))
        return env

    def describe(self) -> str:
        parts = []
        if self.gpus is not None:
            parts.append(f"GPU {','.join(self.gpus)}" if self.gpus else "no GPU")
        if self.cpus is not None:
            parts.append(f"CPU {_ranges(self.cpus)}")
        return " ".join(parts)


def visible_gpus(environ: Mapping[str, str] | None = None,
                 driver_dir: str = _NVIDIA_GPUS) -> list[str]:
    """The GPUs this process may hand out: ``CUDA_VISIBLE_DEVICES`` when set (its entries,
    indices or UUIDs), else the NVIDIA driver's list (indices), else none."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [g.strip() for g in environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    try:
        return [str(i) for i in range(len(os.listdir(driver_dir)))]
    except OSError:
        return []


def local_shares(plan, gpus_per_task: float | None,
                 cpus_per_task: float | None) -> dict[TaskId, DeviceShare]:
    """The split of this machine for a local run of ``plan`` (a ``ClusterPlan``): its GPUs
    and this process's CPUs, with the whole counts ``--gpus-per-task`` and
    ``--cpus-per-task`` give (LaunchConfig checked they are whole)."""
    return share_devices(plan.tasks, gpus=visible_gpus(), cpus=sorted(os.sched_getaffinity(0)),
                         gpus_per_task=None if gpus_per_task is None else int(gpus_per_task),
                         cpus_per_task=None if cpus_per_task is None else int(cpus_per_task),
                         ps_cluster=bool(plan.cluster.ps))


def share_devices(tasks: Sequence[TaskId], *, gpus: Sequence[str], cpus: Sequence[int],
                  gpus_per_task: int | None, cpus_per_task: int | None,
                  ps_cluster: bool) -> dict[TaskId, DeviceShare]:
    """Each task's GPUs and CPUs; every task gets a share (empty when nothing is split).

    Raises ConfigError when the machine has too few GPUs or CPUs for what was asked.
    """
    computing = [t for t in tasks if _computes(t, ps_cluster)]
    takers = [t for t in computing if t.role != "evaluator"]
    gpu_shares = _share_gpus(tasks, takers, computing, list(gpus), gpus_per_task)
    if cpus_per_task is None:
        cpus_per_task = _default_cpus_per_task(tasks, cpus, ps_cluster)
    cpu_shares = _share_cpus(tasks, list(cpus), cpus_per_task or None)  # 0: shared
    return {t: DeviceShare(gpus=gpu_shares.get(t), cpus=cpu_shares.get(t)) for t in tasks}


def describe_shares(shares: Mapping[TaskId, DeviceShare]) -> str | None:
    """One banner line ("worker:0 GPU 0 CPU 0-3, worker:1 ..."), None when nothing is split."""
    described = [(t, s.describe()) for t, s in shares.items()]
    if not any(text for _, text in described):
        return None
    return ", ".join(f"{t} {text}" for t, text in described if text)


def _computes(task: TaskId, ps_cluster: bool) -> bool:
    if task.role == "ps":
        return False
    return not (ps_cluster and task.role == "chief")  # the PS coordinator dispatches only


def _share_gpus(tasks, takers, computing, gpus: list[str], per_task: int | None
                ) -> dict[TaskId, tuple[str, ...]]:
    if per_task is None:
        # Default: one GPU per computing task when there are enough (else leave them shared).
        if len(gpus) < 2 or not takers or len(takers) > len(gpus):
            return {}
        per_task = 1
    if per_task * len(takers) > len(gpus):
        raise ConfigError(
            f"--gpus-per-task {per_task} for {len(takers)} task(s) that train needs "
            f"{per_task * len(takers)} GPUs; this machine gives {len(gpus)}",
            expected=f"at most {len(gpus) // max(len(takers), 1)} GPU(s) per task here",
            fix="Pass a smaller --gpus-per-task, fewer --workers, or make more GPUs visible "
                "(CUDA_VISIBLE_DEVICES)", received=f"GPUs {','.join(gpus) or 'none'}")
    shares: dict[TaskId, tuple[str, ...]] = {t: () for t in tasks}
    free = iter(gpus)
    for task in computing:  # takers first, then the evaluator with what is left
        block = tuple(g for _, g in zip(range(per_task), free))
        shares[task] = block if len(block) == per_task else ()
    return shares


def _default_cpus_per_task(tasks, cpus: Sequence[int], ps_cluster: bool) -> int | None:
    """An even split for a MultiWorkerMirrored cluster that fits one task per CPU, else None
    (shared): a ps cluster's servers mostly wait, and would each hold CPUs idle."""
    if ps_cluster or not 2 <= len(tasks) <= len(cpus):
        return None
    return len(cpus) // len(tasks)


def _share_cpus(tasks, cpus: list[int], per_task: int | None) -> dict[TaskId, tuple[int, ...]]:
    if per_task is None:
        return {}
    if per_task * len(tasks) > len(cpus):
        raise ConfigError(
            f"--cpus-per-task {per_task} for {len(tasks)} task(s) needs "
            f"{per_task * len(tasks)} CPUs; this process may use {len(cpus)} ({_ranges(cpus)})",
            expected=f"at most {len(cpus) // len(tasks)} CPU(s) per task here",
            fix="Pass a smaller --cpus-per-task (or 0: tasks then share every CPU)",
            received=per_task)
    return {t: tuple(cpus[i * per_task:(i + 1) * per_task]) for i, t in enumerate(tasks)}


def _ranges(numbers: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
