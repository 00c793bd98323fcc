"""The run directory: created atomically, private, and locked for the run's lifetime.

* ``runs/<time>-<name>``: created with ``mkdir`` (no exists-then-create race); a name
  taken by a concurrent run gets the next suffix ``-1``, ``-2``, ...;
* an explicit ``--run-dir``/``--run-id`` may exist: a run that failed or was stopped
  (SIGTERM, Ctrl-C, a requeue) resumes there, from its backups, with the same command; a
  finished (succeeded) run is refused, and so is a directory in use: an exclusive ``flock`` on
  ``.tfrun/lock`` is held until the launch ends, so the same directory twice at once is
  refused, naming the other launcher's pid;
* inside a job that can be started again (a Slurm batch job, requeued after a preemption),
  the job names the run: ``runs/<resume key>-<name>`` (``slurm-<job id>-train``), so the
  requeued job's same command resumes there with no edit; a run there that succeeded is
  not refused, the command gets a new ``runs/<time>-<name>`` instead;
* directories tfrun creates are ``0700``: logs and ``config.json`` hold the script's
  output and arguments.

Every failure (a file in the way, a read-only or full disk, ``/proc``) is a ConfigError.

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp())
    >>> with RunDir.create(root / "r1") as run_dir:
    ...     oct(run_dir.path.stat().st_mode & 0o777)
    '0o700'
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
from datetime import datetime
from pathlib import Path

from ...errors import ConfigError
from ..config import LaunchConfig

__all__ = ["RESUMABLE", "RunDir", "ended_status", "planned_run_dir", "run_dir_for"]

#: How a run may have ended for the same command to resume it in the same run directory
#: (its backups are there): anything but success.
RESUMABLE = ("failed", "interrupted", "join-timeout", "hang-timeout")


def ended_status(path: Path) -> str | None:
    """How the run in ``path`` ended (its summary's status), None when it wrote no summary
    (a new directory, or a launcher killed outright: resumable too); "unknown" for a
    summary that cannot be read (never resumed: it may be a finished run)."""
    summary = Path(path) / "summary.json"
    if not summary.exists():
        return None
    try:
        status = json.loads(summary.read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return "unknown"
    return status if isinstance(status, str) else "unknown"


class RunDir:
    """A created, locked run directory; ``close()`` releases the lock (idempotent)."""

    def __init__(self, path: Path, lock_fd: int) -> None:
        self.path = path
        self._lock_fd: int | None = lock_fd

    @classmethod
    def create(cls, path: Path, *, exclusive: bool = False) -> RunDir:
        """Create (``exclusive``: must not exist yet) and lock ``path``. On failure, what
        this call created is removed again."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise ConfigError(f"Run directory {path} is a file", expected="a directory path",
                              fix="Pick another --run-dir", received=str(path))
        created = False  # only what this call made is undone on failure
        fd = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            try:
                path.mkdir(mode=0o700)  # atomic: exactly one creator wins
                created = True
            except FileExistsError:
                if exclusive:
                    raise
            ended = ended_status(path)
            if ended is not None and ended not in RESUMABLE:
                raise ConfigError(f"Run directory {path} already holds a finished run",
                                  expected="a new or empty directory, or one whose run failed "
                                           "or was stopped (it resumes there)",
                                  fix="Pick another --run-dir/--run-id, or omit it for "
                                      "runs/<time>-<name>",
                                  received=f"{path} (ended: {ended})")
            (path / ".tfrun").mkdir(mode=0o700, exist_ok=True)
            fd = os.open(path / ".tfrun" / "lock", os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                other = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise ConfigError(f"Run directory {path} is in use by another tfrun "
                                  f"(pid {other})",
                                  expected="a run directory no other launch is using",
                                  fix="Wait for that run to end, or pick another "
                                      "--run-dir/--run-id", received=str(path)) from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            (path / "logs").mkdir(mode=0o700, exist_ok=True)
        except BaseException as exc:
            _undo(fd, path if created else None)
            if exclusive and isinstance(exc, FileExistsError) and exc.filename == str(path):
                raise  # the caller tries the next name
            if isinstance(exc, OSError):
                raise _unusable(path, exc) from None
            raise
        return cls(path.resolve(), fd)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

    def __enter__(self) -> RunDir:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _undo(fd: int | None, created: Path | None) -> None:
    if fd is not None:
        os.close(fd)
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)


def _unusable(path: Path, exc: OSError) -> ConfigError:
    why = "the disk is full" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    return ConfigError(f"Cannot create run directory {path}: {why}",
                       expected="a writable directory with free space",
                       fix="Pick another --run-dir, or free some space",
                       received=f"{path} ({exc.filename or path}: {why})")


def planned_run_dir(config: LaunchConfig) -> Path:
    """Where ``run_dir_for`` would put this run (nothing is created: ``--dry-run``)."""
    if config.run_dir or config.run_id:
        return Path(config.run_dir) if config.run_dir else Path(config.runs_root) / config.run_id
    if config.resume_key:
        return _resumable_path(config)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(config.runs_root) / f"{stamp}-{config.display_name}"


def _resumable_path(config: LaunchConfig) -> Path:
    return Path(config.runs_root) / f"{config.resume_key}-{config.display_name}"


def run_dir_for(config: LaunchConfig) -> RunDir:
    """The run directory ``config`` asks for (see the module docstring), created and locked."""
    if config.run_dir or config.run_id:
        path = Path(config.run_dir) if config.run_dir else Path(config.runs_root) / config.run_id
        return RunDir.create(path)
    if config.resume_key:
        # The job's own name for the run: a requeued job's same command resumes there. A
        # run there that succeeded is not refused (nobody named the directory): the
        # command runs again in a new one, as it would outside the job.
        path = _resumable_path(config)
        if ended_status(path) in (None, *RESUMABLE):
            return RunDir.create(path)
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    base = Path(config.runs_root) / f"{stamp}-{config.display_name}"
    for n in range(10_000):
        try:
            return RunDir.create(base if n == 0 else Path(f"{base}-{n}"), exclusive=True)
        except FileExistsError:
            continue
    raise ConfigError(f"Too many runs named {base}", expected="fewer than 10000 runs a second",
                      fix="Pass --name or --run-dir", received=str(base))
