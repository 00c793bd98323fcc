"""The run's temporary directory on one host: the TMPDIR of every task tfrun starts there.

TensorFlow's autograph writes a file per converted function into the temporary directory
and removes it at the interpreter's exit, which a SIGKILLed or preempted task never
reaches. Giving the tasks a directory of the run's own lets the run take all of it when
it ends, however its tasks ended:

    >>> tmp = RunTemporaryDirectory.make()  # e.g. /tmp/tfrun-tmp-1234-k2j3x9
    >>> tmp.path.name.startswith(f"tfrun-tmp-{os.getpid()}-")
    True
    >>> tmp.remove(); tmp.path.exists()
    False

Three removers, for three ways a run ends:
- its owner (the backend that made it) when it closes;
- the owner's reaper if the owner alone dies (``+dir:`` in ``reaper.py``);
- the next tfrun on the host if both died at once (a Slurm step's end kills the whole
  process tree, a vanished host, ``kill -9`` of a process group): ``sweep_ended``.

The owner holds an exclusive ``flock`` on ``.owner`` inside the directory for as long as
the directory is in use. The kernel drops it when the owner's process ends, however it
ends; so "the lock can be taken" means "no one owns this", with no pid to go stale or be
reused and no pid namespace to hide the owner.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from pathlib import Path

__all__ = ["RunTemporaryDirectory", "remove", "sweep_ended"]

_PREFIX = "tfrun-tmp-"
_OWNER = ".owner"
#: An empty directory without ``.owner`` older than this is a removal cut short (or a
#: make cut short between its two first steps), never one being made.
_EMPTY_AFTER_SECONDS = 60.0


class RunTemporaryDirectory:
    """A ``tfrun-tmp-<pid>-*`` directory (0700) that this process owns until ``remove``."""

    def __init__(self, path: Path, lock: int) -> None:
        self.path = path
        self._lock = lock

    @classmethod
    def make(cls, base: Path | None = None) -> "RunTemporaryDirectory":
        """Make one in ``base`` (default: this process's temporary directory, so a TMPDIR
        set for tfrun is the disk it lives on), after sweeping the ended runs' there."""
        base = Path(base or tempfile.gettempdir())
        sweep_ended(base)
        path = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-", dir=base))
        # Locked under another name, then renamed: a sweeper only opens ``.owner``, so it
        # never finds the file made but not yet locked.
        making = path / f"{_OWNER}.new"
        lock = os.open(making, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError:
            # A filesystem without locks (ENOLCK: some network mounts): the directory
            # works all the same; only a later sweep cannot tell it is ended.
            os.close(lock)
            os.rename(making, path / ".unlocked")  # never empty, so never swept as one
            return cls(path, -1)
        os.rename(making, path / _OWNER)
        return cls(path, lock)

    def remove(self) -> None:
        """Remove the directory, then give up the lock (so no sweeper races the removal)."""
        remove(self.path)
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1


def remove(path: Path | str) -> None:
    """Remove a run temporary directory, ``.owner`` last: whoever removes it (its owner, its
    owner's reaper, a sweep) may be killed halfway -- a Slurm step's end or a vanishing
    host kills the reaper just after the owner -- and a directory that still has its
    ``.owner`` is one the next sweep finishes."""
    path = Path(path)
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        if entry.name == _OWNER:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    for last in (path / _OWNER, path):
        try:
            (os.rmdir if last == path else os.unlink)(last)
        except OSError:
            pass


def sweep_ended(base: Path) -> list[Path]:
    """Remove the run temporary directories in ``base`` that no process owns any more, and
    return them. A directory whose lock is held, or that has no ``.owner`` (being made, or
    another user's, or a tfrun's older than this), is left alone -- unless it is empty and
    older than a minute (a removal cut short between its last two steps).

        >>> sweep_ended(Path("/nonexistent"))
        []
    """
    swept = []
    for path in sorted(Path(base).glob(f"{_PREFIX}*")):
        try:
            lock = os.open(path / _OWNER, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            if _empty_and_old(path):
                swept.append(path)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its owner is alive
        else:
            remove(path)
            swept.append(path)
        finally:
            os.close(lock)
    return swept


def _empty_and_old(path: Path) -> bool:
    """Removed it if it was: an empty directory, unchanged for ``_EMPTY_AFTER_SECONDS``."""
    try:
        if time.time() - path.stat().st_mtime < _EMPTY_AFTER_SECONDS:
            return False
        os.rmdir(path)  # fails unless empty
    except OSError:
        return False
    return True
