"""One worker's backup files: written whole or not at all, listed, loaded and checked.

A backup ``<stem>`` is its weights and optimizer state (``<stem>.state/``, see
``snapshot``: the same form in both Keras flavours) and its *mark* ``<stem>.json``: the
position it stands for (epoch, batch, global step, input position, replicas). The state
is copied to host memory on the training thread and written in the background (at most
one write in flight; ``contract.BACKUP_WRITE=sync`` writes on the training thread, the
copy made all the same); each file is fsynced, then the directory,
and the mark is written last, so a mark on disk always means a whole backup, even after
a power loss.

The mark also keeps each state file's checksum (its *files record*, see ``integrity``).
A restore is checked: every file must hold the bytes written (else ``BackupDamaged``,
naming the backup, the file and what differed: the caller takes another copy), the state
must fit the model (count, shapes and dtypes of its variables) and the optimizer's step
after loading must equal the mark's (``RestoreMismatch`` names the backup and what
differed). A mark whose state is gone is listed all the same, so that its load names it.

A write the disk refuses (full, an I/O error, read-only) is said once on the console and
recorded as a ``contract.BACKUP_NOT_WRITTEN_EVENT`` each time; training goes on from the
backups already complete, and the next backup tries again. Older backups are removed only
once a newer one is complete (its files flushed and checked for size, its mark written).

    >>> store = BackupStore("/tmp/run/backup/worker-0")  # doctest: +SKIP
    >>> [s["name"] for s in store.saves()]  # doctest: +SKIP
    ['epoch-1', 'step-40']
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import sys

from ... import contract
from ..measure.metrics import record_training_event
from ..notes import say_once
from . import snapshot

__all__ = ["BackupDamaged", "BackupStore", "RestoreMismatch", "complete_epochs",
           "complete_saves", "key", "KEEP"]

_EPOCH_FILE = re.compile(r"epoch-(\d+)\.json")
_SAVE_FILE = re.compile(r"(epoch|step)-(\d+)\.json")
_WORKER_DIR = re.compile(r"(worker|chief)-\d+")
#: Backups each worker keeps: workers are at most one save point apart (synchronous
#: training), and an epoch's last step can be saved twice (as a step and as the epoch).
KEEP = 3


class RestoreMismatch(RuntimeError):
    """A loaded backup is not the state its mark describes."""


class BackupDamaged(RuntimeError):
    """A backup's file is missing, truncated or holds other bytes than were written; no
    byte of it reached a variable. ``save``: the backup; ``file``, ``what``: as
    ``integrity.StateDamaged``."""

    def __init__(self, save: dict, file: str, what: str) -> None:
        super().__init__(f"{save['directory']}/{save['name']}.state/{file}: {what}")
        self.save, self.file, self.what = save, file, what


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
        files = mark.get("files")
        files = None if files is None else {str(name): {"bytes": int(entry["bytes"]),
                                                        "xxh3": str(entry["xxh3"])}
                                            for name, entry in files.items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None  # unreadable: as if absent (the mark is written last)
    return {"epoch": epoch, "batch": batch, "name": stem, "key": key(epoch, batch),
            "input": position, "replicas": None if replicas is None else int(replicas),
            "step": None if step is None else int(step), "directory": directory,
            "files": files}


def _order(save: dict) -> tuple:
    return save["key"], save["name"].startswith("epoch")


def complete_saves(directory: str) -> list[dict]:
    """Every complete backup in ``directory`` (epoch and step ones), oldest first: dicts
    with ``epoch`` (where Keras' loop resumes), ``batch`` (batches of that epoch already
    trained), ``name`` (the files' stem), ``key`` (the position, comparable), ``input``
    (``(iterator, batches)``, see ``position.InputPosition``; None when not recorded),
    ``replicas`` (replicas in sync when taken; None: not recorded), ``step`` (the
    optimizer's step; None: not recorded), ``directory`` and ``files`` (each state file's
    size and checksum; None: written without checksums). A mark whose state is missing is
    listed: loading it names what is missing."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    saves = [mark for name in names if _SAVE_FILE.fullmatch(name)
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
        self._writing: dict | None = None  # the mark of the write in flight
        self._failures = 0  # writes the disk refused since the last complete one
        #: (directory, name) of copies found damaged here: never offered again
        self.damaged: set[tuple[str, str]] = set()

    def saves(self) -> list[dict]:
        return complete_saves(self.directory)

    def visible_saves(self) -> list[dict]:
        """This worker's backups and those of the other workers' directories it can see (a
        shared run dir, or a host that ran another worker), every copy, oldest first (at
        one position: this worker's own last): synchronous workers hold the same state at
        the same step, so any copy serves, and a damaged one has others. After an elastic
        re-form a worker may have been renumbered onto a directory that is not there.
        Copies found damaged in this process are left out."""
        parent, own = os.path.split(self.directory)
        try:
            others = sorted(n for n in os.listdir(parent) if n != own and _WORKER_DIR.fullmatch(n))
        except FileNotFoundError:
            others = []
        copies = [save for name in others for save in complete_saves(os.path.join(parent, name))]
        copies += self.saves()
        return sorted((s for s in copies if (s["directory"], s["name"]) not in self.damaged),
                      key=lambda s: (*_order(s), s["directory"] == self.directory))

    # ---------------------------------------------------------------- writing

    def write(self, model, name: str, mark: dict, *, wait: bool = False) -> None:
        """Back ``model``'s weights and optimizer state up as ``name`` with ``mark`` (epoch,
        batch, step, input, replicas); keep the newest ``KEEP``. The state is copied now;
        the files are written in the background unless ``wait`` (a preemption's save,
        which must be on disk before the task stops) or the store writes synchronously."""
        self.wait()  # one write in flight: the last state's arrays are free again
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            self._refused({**mark, "name": name}, error)
            return
        state = self._state = snapshot.take(model, into=self._state)
        final = os.path.join(self.directory, f"{name}.state")

        def write_mark(files: dict) -> None:
            _check_written(final, files)
            path = os.path.join(self.directory, f"{name}.json")
            try:
                with open(path + ".tmp", "w") as f:
                    json.dump({**mark, "files": files}, f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError:
                _remove_file(path + ".tmp")
                shutil.rmtree(final, ignore_errors=True)  # space back for the older ones
                raise
            os.replace(path + ".tmp", path)  # complete from here on
            snapshot.fsync_path(self.directory)
            for old in self.saves()[:-KEEP]:  # another worker may be one save point behind
                self.remove(old["name"])

        self._writing = {**mark, "name": name}
        try:
            self._writer.write(state, final, write_mark,
                               background=self.background and not wait)
        except snapshot.WriteFailed as failed:  # written on this thread, and refused
            self._writing = None
            self._refused({**mark, "name": name}, failed.error)
            return
        if not self.background or wait:
            self.wait()  # done: says when backups are written again

    def wait(self) -> bool:
        """Until the backup being written (if any) is complete on disk; False when the
        disk refused it (said and recorded: the older backups stay)."""
        writing, self._writing = self._writing, None
        try:
            self._writer.wait()
        except snapshot.WriteFailed as failed:
            self._refused(writing or {}, failed.error)
            return False
        if writing is not None and self._failures:
            print(f"tfrun: backups are written again ({writing['name']} is complete, after "
                  f"{self._failures} the disk refused)", flush=True)
            self._failures = 0
        return True

    @property
    def failing(self) -> bool:
        """Whether the newest backup asked for was refused by the disk (none complete since)."""
        return self._failures > 0

    def _refused(self, writing: dict, error: OSError) -> None:
        """Say (once per kind of error) and record that the disk refused a backup."""
        self._failures += 1
        name = writing.get("name", "a backup")
        older = [s["name"] for s in self.saves()]
        say_once(f"backup-refused-{error.errno}",
                 f"tfrun: backup {name} not written: {error.strerror or error} "
                 f"({self.directory}). Training goes on; "
                 + (f"the older backups stay (newest: {older[-1]})" if older else
                    "there is no older backup yet")
                 + ", and each next backup tries again. Free space or fix the disk",
                 file=sys.stdout)
        record_training_event(contract.BACKUP_NOT_WRITTEN_EVENT, step=writing.get("step"),
                              backup=name, error=error.strerror or str(error),
                              errno=error.errno)

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
                    _remove_file(path)

    def remove(self, name: str) -> None:
        _remove_file(os.path.join(self.directory, f"{name}.json"))  # first: never a mark alone
        shutil.rmtree(os.path.join(self.directory, f"{name}.state"), ignore_errors=True)


    # ---------------------------------------------------------------- reading

    def load(self, model, save: dict) -> None:
        """Load ``save`` (one of ``visible_saves()``) into ``model``, whose optimizer must
        be built, its files checked first (``BackupDamaged``: not loaded, and never offered
        again by ``visible_saves``), then the result (``verify``)."""
        self.wait()
        directory, name = save["directory"], save["name"]
        try:
            snapshot.load(model, os.path.join(directory, f"{name}.state"), save.get("files"))
        except snapshot.StateDamaged as damage:
            self.damaged.add((directory, name))
            raise BackupDamaged(save, damage.file, damage.what) from None
        except snapshot.StateMismatch as error:
            raise RestoreMismatch(
                f"tfrun.backup_and_restore: the backup {directory}/{name} does not match this "
                f"model: {error}. Was it written by another script? Remove "
                f"{os.path.dirname(directory)} to start over. Received: {directory}/{name}"
            ) from None
        verify(save, _optimizer_step(model))


def _remove_file(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _check_written(final: str, files: dict) -> None:
    """Before a mark makes a state complete: its files are there at their sizes (the
    bytes themselves are checked when read back, at a restore: reading gigabytes back
    after every backup would take the disk from training)."""
    for name, record in files.items():
        size = os.path.getsize(os.path.join(final, name))
        if size < record["bytes"]:
            raise OSError(errno.EIO, f"{name} has {size} bytes after the write, "
                                     f"{record['bytes']} were written")


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
