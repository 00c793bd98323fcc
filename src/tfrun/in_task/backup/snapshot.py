"""A model's training state as files: taken in host memory at once, written in the background.

A backup must not stall training. ``take(model)`` copies every weight and optimizer
variable into host memory (the only part the training thread waits for: a memory copy);
``Writer.write(...)`` then puts the copy on disk in a background thread while the next
steps run: ``<stem>.state/values.bin`` (the values' bytes, one after the other) and
``<stem>.state/variables.json`` (each variable's path, shape, dtype and offset), each
flushed to the device, then the directory, then the backup's mark. At most one write is in
flight: the next backup, a preemption and the end of training wait for it (``wait``).

One format for both Keras flavours; ``load(model, directory)`` assigns the values back in
the same order and refuses a state whose variables do not match the model's.

    >>> state = take(model)                          # doctest: +SKIP
    >>> writer.write(state, "backup/step-40.state", on_done=write_mark)  # doctest: +SKIP
    >>> writer.wait()                                # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass

__all__ = ["State", "StateMismatch", "Writer", "take", "load", "state_variables"]

_VALUES, _INDEX = "values.bin", "variables.json"


class StateMismatch(RuntimeError):
    """A state on disk does not fit the model it is loaded into."""


@dataclass
class State:
    """Host-memory copies of a model's variables, in ``state_variables`` order."""

    paths: list[str]
    values: list  # numpy arrays


def state_variables(model) -> list:
    """What a backup holds: the model's weights (trainable and not), then its optimizer's
    variables (its step, its slots), in an order that is the same in every process that
    builds the same model."""
    variables = list(model.weights)
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        found = optimizer.variables
        variables += list(found() if callable(found) else found)
    return variables


def _path(variable, index: int) -> str:
    return str(getattr(variable, "path", None) or getattr(variable, "name", None) or index)


def take(model, into: State | None = None) -> State:
    """Copy the model's state into host memory (numpy arrays the training cannot change).

    ``into``: the state of the previous backup, whose written arrays are reused when they
    fit. A fresh 2.4 GB allocation costs its page faults on every backup (measured: 5.3 s,
    against well under a second to copy into pages already mapped), and the training
    thread waits for the copy."""
    import numpy as np

    variables = state_variables(model)
    reuse = into.values if into is not None and len(into.values) == len(variables) else None
    values = []
    for i, variable in enumerate(variables):
        value = np.asarray(variable.numpy() if hasattr(variable, "numpy") else variable)
        held = reuse[i] if reuse is not None else None
        if held is None or held.shape != value.shape or held.dtype != value.dtype:
            held = np.empty_like(value)
        np.copyto(held, value)
        values.append(held)
    return State([_path(v, i) for i, v in enumerate(variables)], values)


def _fsync(path: str, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_now(state: State, final: str) -> None:
    """Write ``state`` as the directory ``final`` (under a temporary name, flushed, then
    renamed: a write cut short is never taken for a whole one)."""
    temporary = final + ".tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    os.makedirs(temporary)
    index, offset = [], 0
    with open(os.path.join(temporary, _VALUES), "wb") as out:
        for path, value in zip(state.paths, state.values):
            out.write(memoryview(value.reshape(-1).view("uint8")))  # releases the GIL
            index.append({"path": path, "shape": list(value.shape), "dtype": str(value.dtype),
                          "offset": offset})
            offset += value.nbytes
        out.flush()
        os.fsync(out.fileno())
    with open(os.path.join(temporary, _INDEX), "w") as out:
        json.dump({"variables": index, "bytes": offset}, out)
        out.flush()
        os.fsync(out.fileno())
    _fsync(temporary, directory=True)
    shutil.rmtree(final, ignore_errors=True)  # the same point saved again
    os.replace(temporary, final)
    _fsync(os.path.dirname(final) or ".", directory=True)


class Writer:
    """Writes states in a background thread, one at a time."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def write(self, state: State, final: str, on_done=None, *, background: bool = True) -> None:
        """Write ``state`` to ``final``, then call ``on_done()`` (which writes the mark);
        in the background unless ``background=False``. Waits for the write before first."""
        self.wait()

        def work() -> None:
            try:
                write_now(state, final)
                if on_done is not None:
                    on_done()
            except BaseException as error:  # reported by the next wait()
                self._error = error

        if not background:
            work()
            self._raise()
            return
        self._thread = threading.Thread(target=work, name="tfrun-backup-writer", daemon=True)
        self._thread.start()

    def wait(self) -> None:
        """Until the write in flight (if any) is on disk; raises what it failed with."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._raise()

    def _raise(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise RuntimeError(f"tfrun.backup_and_restore: writing a backup failed: {error}. "
                               "Check the backup directory's disk (space, permissions)") from error


def load(model, directory: str) -> None:
    """Assign the state in ``directory`` to ``model``'s variables (its optimizer built).

    Raises StateMismatch, naming the first variable that differs, when the state was
    written by another model (another count, shape or dtype of variables)."""
    import numpy as np

    with open(os.path.join(directory, _INDEX)) as f:
        index = json.load(f)["variables"]
    variables = state_variables(model)
    if len(index) != len(variables):
        raise StateMismatch(f"{directory} holds {len(index)} variables, this model and its "
                            f"optimizer have {len(variables)}")
    values = np.memmap(os.path.join(directory, _VALUES), dtype="uint8", mode="r")
    for entry, variable in zip(index, variables):
        shape, dtype = tuple(entry["shape"]), np.dtype(entry["dtype"])
        own_shape = tuple(variable.shape)
        own_dtype = np.dtype(getattr(variable.dtype, "as_numpy_dtype", variable.dtype))
        if shape != own_shape or dtype != own_dtype:
            raise StateMismatch(f"{directory}: variable {entry['path']} is {shape} {dtype}, "
                                f"this model's {_path(variable, 0)} is {own_shape} {own_dtype}")
        count = int(np.prod(shape, dtype=np.int64))
        start = entry["offset"]
        value = values[start:start + count * dtype.itemsize].view(dtype).reshape(shape)
        variable.assign(np.array(value))
