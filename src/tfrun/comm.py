"""Collective communication options: ``tfrun --comm`` -> ``CommunicationOptions``.

The launcher validates the text and hands it to every task as ``contract.COMM``; in the task,
``tfrun.strategy()`` and a plain ``tf.distribute.MultiWorkerMirroredStrategy()`` (one made
without ``communication_options``) get it as
``tf.distribute.experimental.CommunicationOptions``. Pure until ``to_tf``.

Syntax: comma-separated ``IMPLEMENTATION`` and ``key=value`` items. Implementations:
``auto`` (the default) -- on CPU, tfrun's shared-memory all-reduce when every worker is on one
host (see ``tfrun.in_task.exchange.shm_allreduce``), its TCP all-reduce when every worker is on a host of
its own (``tfrun.in_task.exchange.tcp_allreduce``), both in turn when every host runs the same number
of workers (``tfrun.in_task.exchange.hierarchical_allreduce``), TensorFlow's choice otherwise (GPUs,
uneven hosts); ``shm`` -- shared memory, an error when the workers span hosts;
``tcp`` -- tfrun's TCP exchange between every chief/worker, wherever they are; ``ring``,
``nccl`` -- TensorFlow's.
Items:
``pack=SIZE`` (``bytes_per_pack``: gradients are all-reduced in packs of about this size;
``0`` lets TensorFlow choose), ``timeout=SECONDS`` (a collective that takes longer fails) and
``compress=fp16|bf16|none`` (the TCP exchange sends 16-bit values: half the bytes on the
wire, summed in float32; the default ``none`` keeps every bit -- tfrun's exchanges round
the same way on shared memory too, where float32 still moves, so that a run's numerics do
not depend on where its workers are; ``ring`` and ``nccl`` refuse it; see
``tfrun.in_task.exchange.compression``) and ``feedback`` (with ``compress``: each task
keeps what rounding took from its gradients and adds it to the next step's) and
``overlap=on|off|auto`` (a step's gradients are exchanged in buckets of ``pack`` bytes,
2 MiB when 0, while backprop still runs -- ``tfrun.in_task.exchange.overlap``; ``off``
exchanges them all at once after backprop; ``auto``, the default, overlaps across hosts and
not on one host, where the native op inside the step measured faster).
Sizes take K/M/G suffixes (powers of 1024, optional ``B``/``iB``).

    >>> CommOptions.parse("ring,pack=4MB,timeout=120")
    CommOptions(implementation='ring', bytes_per_pack=4194304, timeout_seconds=120.0, compression='none', feedback=False, overlap=None)
    >>> CommOptions.parse("pack=0").to_text()
    'auto,pack=0'
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from . import contract
from .errors import ConfigError

__all__ = ["COMM_ENV", "CollectiveMembers", "CommOptions", "collective_members", "from_env",
           "parse_size"]

COMM_ENV = contract.COMM
IMPLEMENTATIONS = ("auto", "ring", "nccl", "shm", "tcp")
COMPRESSIONS = ("none", "fp16", "bf16")
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmg]?)(?:i?b)?$", re.IGNORECASE)
_FIX = "Pass e.g. --comm ring,pack=4MB,timeout=300"


@dataclass(frozen=True)
class CommOptions:
    implementation: str = "auto"
    bytes_per_pack: int = 0
    timeout_seconds: float | None = None
    compression: str = "none"
    feedback: bool = False
    overlap: bool | None = None  # None: auto (across hosts on, on one host off)

    @classmethod
    def parse(cls, text: str) -> CommOptions:
        implementation, pack, timeout, compression, feedback = "auto", 0, None, "none", False
        overlap: bool | None = None
        items = [item.strip() for item in text.split(",")]
        if not text.strip() or not all(items):
            raise ConfigError("--comm has an empty item", expected=_expected(), fix=_FIX,
                              received=repr(text))
        for item in items:
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep and key in IMPLEMENTATIONS:
                implementation = key
            elif not sep and key == "feedback":
                feedback = True
            elif sep and key == "overlap" and value.strip().lower() in ("on", "off", "auto"):
                overlap = {"on": True, "off": False, "auto": None}[value.strip().lower()]
            elif sep and key == "pack":
                pack = _parse_size(value.strip(), text)
            elif sep and key == "timeout":
                timeout = _parse_timeout(value.strip(), text)
            elif sep and key == "compress":
                compression = value.strip().lower()
                if compression not in COMPRESSIONS:
                    raise ConfigError(f"--comm compress={value.strip()!r} is not a compression",
                                      expected="compress=fp16, compress=bf16 or compress=none",
                                      fix="Pass e.g. --comm compress=fp16", received=repr(text))
            else:
                raise ConfigError(f"--comm item {item!r} is not understood", expected=_expected(),
                                  fix=_FIX, received=repr(text))
        if compression != "none" and implementation not in ("auto", "tcp", "shm"):
            raise ConfigError(f"--comm compress={compression} needs tfrun's exchange; "
                              f"TensorFlow's {implementation} moves full precision",
                              expected="--comm auto, tcp or shm with compress=...",
                              fix=f"Pass e.g. --comm tcp,compress={compression}, or drop compress",
                              received=repr(text))
        if feedback and compression == "none":
            raise ConfigError("--comm feedback keeps the rounding error of a compressed "
                              "exchange; nothing is compressed",
                              expected="feedback with compress=fp16 or compress=bf16",
                              fix="Pass e.g. --comm compress=bf16,feedback, or drop feedback",
                              received=repr(text))
        return cls(implementation, pack, timeout, compression, feedback, overlap)

    def exchange_fields(self, *, across_hosts: bool) -> dict:
        """What a plan of tfrun's exchange takes from these options: ``compression``,
        ``feedback`` and ``overlap`` (``auto``: on for an exchange across hosts, off on one
        host).

            >>> CommOptions.parse("compress=bf16").exchange_fields(across_hosts=False)
            {'compression': 'bf16', 'feedback': False, 'overlap': False}
        """
        overlap = across_hosts if self.overlap is None else self.overlap
        return {"compression": self.compression, "feedback": self.feedback, "overlap": overlap}

    def to_text(self) -> str:
        """The ``--comm`` text (``contract.COMM``) that parses back to these options."""
        text = f"{self.implementation},pack={self.bytes_per_pack}"
        text += f",timeout={self.timeout_seconds:g}" if self.timeout_seconds else ""
        text += f",compress={self.compression}" if self.compression != "none" else ""
        text += ",feedback" if self.feedback else ""
        return text + {None: "", True: ",overlap=on", False: ",overlap=off"}[self.overlap]

    def to_tf(self):
        """``tf.distribute.experimental.CommunicationOptions`` (imports TensorFlow); ``shm``
        and ``tcp`` are TensorFlow's AUTO underneath, where tfrun's exchange takes over."""
        import tensorflow as tf

        implementation = "auto" if self.implementation in ("shm", "tcp") else self.implementation

        return tf.distribute.experimental.CommunicationOptions(
            bytes_per_pack=self.bytes_per_pack, timeout_seconds=self.timeout_seconds,
            implementation=getattr(tf.distribute.experimental.CommunicationImplementation,
                                   implementation.upper()))


    def check_hosts(self, hosts, *, expected: str, received: str) -> None:
        """``shm`` needs every chief/worker on one host: a ConfigError when ``hosts`` are
        several (``expected``/``received`` say where they were read)."""
        if self.implementation == "shm" and len(set(hosts)) > 1:
            raise ConfigError("--comm shm needs every worker on one host; shared memory "
                              "cannot cross machines", expected=expected,
                              fix="Use --comm auto (shared memory where every worker is on "
                                  "one host, TensorFlow's collectives otherwise) or --comm ring",
                              received=received)


def from_env(environ=None) -> CommOptions | None:
    """The options tfrun passed this task (``contract.COMM``), or None when it passed none."""
    text = (os.environ if environ is None else environ).get(COMM_ENV)
    return CommOptions.parse(text) if text else None


@dataclass(frozen=True)
class CollectiveMembers:
    """The tasks of a MultiWorkerMirroredStrategy cluster that all-reduce together: ``names``
    (chief first, then workers), each one's ``hosts`` as TF_CONFIG names it, this task's
    ``rank`` among them, the ``comm`` options and the ``cluster`` (a ``cluster.Cluster``)."""

    rank: int
    names: tuple[str, ...]
    hosts: tuple[str, ...]
    comm: CommOptions
    cluster: object


def collective_members(environ, implementations: tuple[str, ...]) -> CollectiveMembers | None:
    """This task's all-reduce group when ``contract.COMM`` asks for one of
    ``implementations`` (absent: ``auto``), the task is a chief or worker of a cluster of at
    least two such tasks, and there are no parameter servers; else None (also for a
    TF_CONFIG tfrun did not make: TensorFlow will say what is wrong with it).

    >>> env = {"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, '
    ...        '"task": {"type": "worker", "index": 1}}'}
    >>> members = collective_members(env, ("auto",))
    >>> members.rank, members.names, members.hosts
    (1, ('worker:0', 'worker:1'), ('a', 'b'))
    """
    from .cluster import parse_address, parse_tf_config

    comm = from_env(environ) or CommOptions()
    if comm.implementation not in implementations or not environ.get("TF_CONFIG"):
        return None
    try:
        config = parse_tf_config(environ["TF_CONFIG"])
    except ConfigError:
        return None
    cluster = config.cluster
    members = {str(task): parse_address(address)[0] for task, address in
               cluster.addresses().items() if task.role in ("chief", "worker")}
    if len(members) < 2 or cluster.ps or str(config.task) not in members:
        return None
    names = tuple(members)  # chief first, then workers
    return CollectiveMembers(rank=names.index(str(config.task)), names=names,
                             hosts=tuple(members.values()), comm=comm, cluster=cluster)


def _expected() -> str:
    return ("comma-separated: one of auto/shm/tcp/ring/nccl, pack=SIZE (e.g. 4MB, 0 = TensorFlow "
            "chooses), timeout=SECONDS, compress=fp16|bf16|none, feedback, overlap=on|off|auto")


def parse_size(value: str) -> int | None:
    """Bytes in ``4MB``, ``512K``, ``1.5MiB``, ``1048576`` (powers of 1024), else None."""
    match = _SIZE.match(value.strip())
    if not match:
        return None
    number, unit = float(match.group(1)), match.group(2).lower()
    return int(number * 1024 ** " kmg".index(unit or " "))


def _parse_size(value: str, text: str) -> int:
    size = parse_size(value)
    if size is None:
        raise ConfigError(f"--comm pack={value!r} is not a size", expected="e.g. pack=4MB, "
                          "pack=512K, pack=1048576 or pack=0", fix=_FIX, received=repr(text))
    return size


def _parse_timeout(value: str, text: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds < float("inf"):
        raise ConfigError(f"--comm timeout={value!r} is not a positive number of seconds",
                          expected="e.g. timeout=300", fix=_FIX, received=repr(text))
    return seconds
