"""One worker's backup files: written whole or not at all, listed, loaded and checked.

A backup ``<stem>`` is its weights and optimizer state (``<stem>.state/``, see
``snapshot``: the same form in both Keras flavours) and its *mark* ``<stem>.json``: the
position it stands for (epoch, batch, global step, input position, replicas). The state
is copied to host memory on the training thread and written in the background (at most
one write in flight; ``contract.BACKUP_WRITE=sync`` writes on the training thread, the
copy made all the same); each file is fsynced, then the directory,
and the mark is written last, so a mark on disk always means a whole backup, even after
a power loss.

A restore is checked: the state must fit the model (count, shapes and dtypes of its
variables) and the optimizer's step after loading must equal the mark's
(``RestoreMismatch`` names the backup and what differed).

    >>> store = BackupStore("/tmp/run/backup/worker-0")  # doctest: +SKIP
    >>> [s["name"] for s in store.saves()]  # doctest: +SKIP
    ['epoch-1', 'step-40']
"""

from __future__ import annotations

import json
import os
import re
import shutil

from ... import contract
from . import snapshot

__all__ = ["BackupStore", "RestoreMismatch", "complete_epochs", "complete_saves", "key",
           "KEEP"]

_EPOCH_FILE = re.compile(r"epoch-(\d+)\.json")
_SAVE_FILE = re.compile(r"(epoch|step)-(\d+)\.json")
_WORKER_DIR = re.compile(r"(worker|chief)-\d+")
#: Backups each worker keeps: workers are at most one save point apart (synchronous
#: training), and an epoch's last step can be saved twice (as a step and as the epoch).
KEEP = 3


class RestoreMismatch(RuntimeError):
    """A loaded backup is not the state its mark describes."""


def key(epoch: int, batch: int) -> int:
    """One comparable integer per position (the same on every worker for one save point).

    >>> key(2, 5) > key(1, 900)
    True
    """
    return epoch * 2**32 + batch


def _has_weights(directory: str, stem: str) -> bool:
    """Whether the backup ``stem`` has its state on disk."""
    return os.path.isdir(os.path.join(directory, f"{stem}.state"))


def complete_epochs(directory: str) -> list[int]:
    """Epochs with a complete backup in ``directory`` (their ``.json`` mark written last)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted(int(m.group(1)) for n in names if (m := _EPOCH_FILE.fullmatch(n))
                  and _has_weights(directory, f"epoch-{m.group(1)}"))


def _read_mark(directory: str, name: str) -> dict | None:
    stem = name[:-len(".json")]
    try:
        with open(os.path.join(directory, name)) as f:
            mark = json.load(f)
        epoch, batch = int(mark["epoch"]), int(mark.get("batch", 0))
        position = mark.get("input")
        position = None if position is None else (int(position[0]), int(position[1]))
        replicas = mark.get("replicas")
        step = mark.get("step")
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None  # unreadable: as if absent (the mark is written last)
    return {"epoch": epoch, "batch": batch, "name": stem, "key": key(epoch, batch),
            "input": position, "replicas": None if replicas is None else int(replicas),
            "step": None if step is None else int(step), "directory": directory}


def _order(save: dict) -> tuple:
    return save["key"], save["name"].startswith("epoch")


def complete_saves(directory: str) -> list[dict]:
    """Every complete backup in ``directory`` (epoch and step ones), oldest first: dicts
    with ``epoch`` (where Keras' loop resumes), ``batch`` (batches of that epoch already
    trained), ``name`` (the files' stem), ``key`` (the position, comparable), ``input``
    (``(iterator, batches)``, see ``position.InputPosition``; None when not recorded),
    ``replicas`` (replicas in sync when taken; None: not recorded), ``step`` (the
    optimizer's step; None: not recorded) and ``directory``."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    saves = [mark for name in names if _SAVE_FILE.fullmatch(name)
             and _has_weights(directory, name[:-len(".json")])
             and (mark := _read_mark(directory, name)) is not None]
    return sorted(saves, key=_order)


class BackupStore:
    """The backups of one worker, in ``directory``; ``legacy``: tf_keras' file form."""

    def __init__(self, directory: str, *, background: bool | None = None) -> None:
        self.directory = directory
        self.background = (os.environ.get(contract.BACKUP_WRITE, "background") != "sync"
                           if background is None else background)
        self._writer = snapshot.Writer()
        self._state: snapshot.State | None = None  # the last one written: its arrays reused

    def saves(self) -> list[dict]:
        return complete_saves(self.directory)

    def visible_saves(self) -> list[dict]:
        """This worker's backups, then those of the other workers' directories it can see
        (a shared run dir, or a host that ran another worker): synchronous workers hold the
        same state at the same step, so any of them serves. After an elastic re-form a
        worker may have been renumbered onto a directory that is not there."""
        mine = self.saves()
        parent, own = os.path.split(self.directory)
        try:
            others = sorted(n for n in os.listdir(parent) if n != own and _WORKER_DIR.fullmatch(n))
        except FileNotFoundError:
            others = []
        seen = {save["key"] for save in mine}
        for name in others:
            for save in complete_saves(os.path.join(parent, name)):
                if save["key"] not in seen or save["name"].startswith("epoch"):
                    mine.append(save)
                    seen.add(save["key"])
        return sorted(mine, key=_order)

    # ---------------------------------------------------------------- writing

    def write(self, model, name: str, mark: dict, *, wait: bool = False) -> None:
        """Back ``model``'s weights and optimizer state up as ``name`` with ``mark`` (epoch,
        batch, step, input, replicas); keep the newest ``KEEP``. The state is copied now;
        the files are written in the background unless ``wait`` (a preemption's save,
        which must be on disk before the task stops) or the store writes synchronously."""
        os.makedirs(self.directory, exist_ok=True)
        self._writer.wait()  # one write in flight: the last state's arrays are free again
        state = self._state = snapshot.take(model, into=self._state)

        def write_mark() -> None:
            path = os.path.join(self.directory, f"{name}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(mark, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(path + ".tmp", path)  # complete from here on
            snapshot.fsync_path(self.directory)
            for old in self.saves()[:-KEEP]:  # another worker may be one save point behind
                self.remove(old["name"])

        self._writer.write(state, os.path.join(self.directory, f"{name}.state"), write_mark,
                           background=self.background and not wait)

    def wait(self) -> None:
        """Until the backup being written (if any) is complete on disk."""
        self._writer.wait()

    def remove_temporaries(self) -> None:
        """Remove what writes cut short left (``*.tmp``: a task killed mid-write). Call
        only while no write is in flight (training starting, or after ``wait``)."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return
        for name in names:
            if name.endswith(".tmp"):
                path = os.path.join(self.directory, name)
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    try:
                        os.remove(path)
                    except FileNotFoundError:
                        pass

    def remove(self, name: str) -> None:
        # the mark first: never a mark without data
        try:
            os.remove(os.path.join(self.directory, f"{name}.json"))
        except FileNotFoundError:
            pass
        shutil.rmtree(os.path.join(self.directory, f"{name}.state"), ignore_errors=True)

    # ---------------------------------------------------------------- reading

    def load(self, model, save: dict) -> None:
        """Load ``save`` (one of ``visible_saves()``) into ``model``, whose optimizer must
        be built, and check it (``verify``)."""
        self._writer.wait()
        directory, name = save["directory"], save["name"]
        try:
            snapshot.load(model, os.path.join(directory, f"{name}.state"))
        except snapshot.StateMismatch as error:
            raise RestoreMismatch(
                f"tfrun.backup_and_restore: the backup {directory}/{name} does not match this "
                f"model: {error}. Was it written by another script? Remove "
                f"{os.path.dirname(directory)} to start over. Received: {directory}/{name}"
            ) from None
        verify(save, _optimizer_step(model))


def _optimizer_step(model) -> int | None:
    optimizer = getattr(model, "optimizer", None)
    iterations = getattr(optimizer, "iterations", None)
    return None if iterations is None else int(iterations.numpy())


def verify(save: dict, step: int | None) -> None:
    """Refuse a restore whose optimizer step is not the one the mark recorded.

    >>> verify({"step": 40, "directory": "b/worker-0", "name": "step-40"}, 40)
    >>> try:
    ...     verify({"step": 40, "directory": "b/worker-0", "name": "step-40"}, 0)
    ... except RestoreMismatch as error:
    ...     print(str(error)[:90])
    tfrun.backup_and_restore: the backup b/worker-0/step-40 was taken at step 40, but the opti
    """
    if save.get("step") is None or step is None or step == save["step"]:
        return
    raise RestoreMismatch(
        f"tfrun.backup_and_restore: the backup {save['directory']}/{save['name']} was taken at "
        f"step {save['step']}, but the optimizer's step after loading it is {step} (its "
        "optimizer state was not restored: a different optimizer, or a damaged file). "
        f"Expected equal steps. Remove {os.path.dirname(save['directory'])} to start over, "
        f"or fix the optimizer. Received: step {step}")
