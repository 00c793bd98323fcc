"""Several tests at a time (pytest-xdist, ``-n 3 --dist loadgroup`` in pyproject.toml)
without one seeing another's processes, files or cgroups.

What each worker gets to itself, set up before its first test (``isolate_worker``):

- a temporary directory (TMPDIR): the run temporary directories, autograph files and
  sockets its runs make there are its own, so a check such as "no ``tfrun-tmp-*`` was
  left" never counts another worker's live ones. The fake hosts' processes, started by
  sshd, use a TMPDIR of their own (``hosts_tmp``, set by the worker that made them);
- a cgroup of its own under this process's (as root, where tfrun makes task cgroups): every
  tfrun it starts -- locally, or through the fake hosts' sshd, Slurm's daemons or Ray's
  raylets that it starts -- makes its task cgroups in there, so a check of the tfrun
  cgroups made since a moment sees only its own.

What the workers share, in one directory made by the controller (``TFRUN_TESTS_SHARED``):

- the turn: a test marked ``alone`` (one that measures how CPU is shared, or needs the
  whole machine) waits for the other workers' tests to end and keeps them from starting
  another until it is done (``turn``);
- the session's reference runs, each made once by whichever worker needs it first
  (``made_once``).

Without ``-n`` (``-p no:xdist``, or ``-n 0``) everything here is a no-op: tests run one
at a time as before.

    >>> with turn(alone=True):  # doctest: +SKIP
    ...     run_the_straggler_test()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: The pytest-xdist worker this process is ("gw0", ...), from ``isolate_worker``; None in
#: the controller, or when tests run one at a time. (Not PYTEST_XDIST_WORKER: a pytest
#: that a test starts inherits that, without being a worker.)
WORKER: str | None = None
#: The directory the controller made for the session's workers to share.
SHARED_ENV = "TFRUN_TESTS_SHARED"
#: The machine's temporary directory, before a worker's own replaces TMPDIR.
MACHINE_TMP = Path(os.environ.get("TFRUN_TESTS_MACHINE_TMP") or tempfile.gettempdir())


_made_here: Path | None = None


def make_shared() -> Path:
    """In the controller, before the workers start (they inherit the environment): the
    directory they share. Short (``/tmp/pt-XXXXXXXX``): a worker's TMPDIR is inside, and
    Unix sockets under a TMPDIR (Ray's, TensorFlow's) must fit in 107 bytes."""
    global _made_here
    _made_here = Path(tempfile.mkdtemp(prefix="pt-", dir=MACHINE_TMP))
    os.environ[SHARED_ENV] = str(_made_here)
    os.environ["TFRUN_TESTS_MACHINE_TMP"] = str(MACHINE_TMP)
    return _made_here


def remove_shared() -> None:
    """In the controller that made it (not in a pytest a test starts, which inherits the
    variable): remove the shared directory."""
    global _made_here
    if _made_here is not None:
        shutil.rmtree(_made_here, ignore_errors=True)
        _made_here = None


def _shared() -> Path | None:
    value = os.environ.get(SHARED_ENV)
    return Path(value) if WORKER and value else None


# --------------------------------------------------------------------------- a worker's own

_cgroup: Path | None = None


def isolate_worker(worker: str) -> None:
    """Give this worker (``"gw0"``) its own TMPDIR and, where tfrun can make cgroups, its
    own cgroup."""
    global WORKER, _cgroup
    WORKER = worker
    shared = _shared()
    if shared is None:
        return
    own_tmp = shared / WORKER
    own_tmp.mkdir(exist_ok=True)
    os.environ["TMPDIR"] = str(own_tmp)
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    from tfrun.launch.processes import cgroups

    if not cgroups.available():
        return
    base = cgroups.own_cgroup_dir()
    _sweep_ended_worker_cgroups(base)
    mine = base / f"tests-{WORKER}-{os.getpid()}"
    mine.mkdir()
    (mine / "cgroup.procs").write_text(str(os.getpid()))
    _cgroup = mine


def release_worker() -> None:
    """Back to the cgroup this worker started in; its own is removed when empty (a tfrun
    cgroup left in it stays, for the next tfrun's sweep -- tests fail on those anyway)."""
    global _cgroup
    if _cgroup is None:
        return
    with contextlib.suppress(OSError):
        (_cgroup.parent / "cgroup.procs").write_text(str(os.getpid()))
        _cgroup.rmdir()
    _cgroup = None


def _sweep_ended_worker_cgroups(base: Path) -> None:
    """Remove the empty cgroups of workers of earlier sessions that ended without
    ``release_worker`` (killed): ``tests-<worker>-<pid>`` whose pid is gone."""
    for path in base.glob("tests-gw*-*"):
        pid = path.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                path.rmdir()


#: The fake hosts' TMPDIR (``FakeHosts.tmp``), in the worker that made them.
hosts_tmp: Path | None = None


def temporary_dirs() -> list[Path]:
    """Where a test's processes make temporary files: this process's TMPDIR (a worker's
    own), the machine's /tmp (for what ignores TMPDIR, and Slurm's or Ray's daemons, started
    with their own environment) and, in the worker that made them, the fake hosts' TMPDIR
    (``hosts_tmp``) -- each once."""
    return sorted({Path(tempfile.gettempdir()), MACHINE_TMP, *([hosts_tmp] if hosts_tmp else [])})


def made_since(started: float, pattern: str, directories: list[Path] | None = None,
               ours: bool = False) -> list[Path]:
    """Entries of ``directories`` (default: ``temporary_dirs()``) matching ``pattern`` made
    at or after ``started`` (a ``time.time()``); with ``ours``, of the run temporary
    directories among them only those this worker started (``started_here``)."""
    found = []
    for directory in temporary_dirs() if directories is None else directories:
        for path in directory.glob(pattern):
            with contextlib.suppress(FileNotFoundError):
                if path.stat().st_ctime >= started and (not ours or started_here(path)):
                    found.append(path)
    return found


def temporary_entries(prefixes: tuple[str, ...]) -> set[Path]:
    """The entries of ``temporary_dirs()`` whose names start with one of ``prefixes``; of
    the run temporary directories (``tfrun-tmp-*``) only those this worker started
    (``started_here``): compare two of these sets to see what a test left."""
    return {path for directory in temporary_dirs() for path in directory.iterdir()
            if path.name.startswith(prefixes) and started_here(path)}


def started_here(directory: Path) -> bool:
    """Whether a run temporary directory (``tfrun-tmp-<pid>-...``; True for any other name)
    whose owner still lives was made by a process this worker started: one in this
    worker's cgroup or below it (True without a cgroup of its own, or when the owner is
    gone). A check that looks in
    the machine's /tmp would otherwise count the live run of a test on another worker
    whose processes do not use that worker's TMPDIR (in CI: a Ray test's teardown
    named a /tmp directory whose owner no Ray test had started)."""
    if _cgroup is None or not directory.name.startswith("tfrun-tmp-"):
        return True
    pid = directory.name.removeprefix("tfrun-tmp-").split("-", 1)[0]
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        mine = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return True
    theirs = next((line[3:] for line in lines if line.startswith("0::")), None)
    ours = next((line[3:] for line in mine if line.startswith("0::")), None)
    if theirs is None or ours is None:
        return True
    return theirs == ours or theirs.startswith(ours.rstrip("/") + "/")


# --------------------------------------------------------------------------- the turn


#: The gate and the room (open lock files) that this worker's last ``alone`` test kept
#: for the next one (``turn(alone=True, keep=True)``).
_held: tuple | None = None


@contextlib.contextmanager
def turn(alone: bool, keep: bool = False) -> Iterator[None]:
    """Hold the room for one test: shared (any number of workers) or ``alone``.

    Two locks, so that an ``alone`` test is not starved by a worker that starts test after
    test: it first takes the gate, which every test passes on its way in, then waits for
    the room to empty. ``keep`` (an ``alone`` test whose next test on this worker is
    ``alone`` too): both stay held for that one, so that the room is emptied once for
    several (in CI: two tests of one module each waited 73-79 s for the room, the other
    workers' tests having started in between)."""
    global _held
    shared = _shared()
    if shared is None:
        yield
        return
    locks, _held = _held, None
    if locks is not None and not alone:  # kept for an alone test that did not come
        _release(*locks, alone=True)
        locks = None
    if locks is None:
        gate, room = open(shared / "gate.lock", "a"), open(shared / "room.lock", "a")
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(room, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        locks = (gate, room)
    try:
        yield
    finally:
        if alone and keep:
            _held = locks
        else:
            _release(*locks, alone=alone)


def _release(gate, room, alone: bool) -> None:
    fcntl.flock(room, fcntl.LOCK_UN)
    if alone:
        fcntl.flock(gate, fcntl.LOCK_UN)
    gate.close()
    room.close()


# --------------------------------------------------------------------------- CPU per test

#: Set to a file path, each worker appends one line per test to it: the CPU seconds its
#: cgroup used during the test (the worker and every process it started, through sshd,
#: Slurm or Ray included), the wall seconds, and the test's id. For finding where the
#: suite's CPU goes: ``sort -rn FILE | head``.
CPU_LOG_ENV = "TFRUN_TESTS_CPU_LOG"


def _cpu_seconds() -> float | None:
    if _cgroup is None:
        return None
    with contextlib.suppress(OSError):
        for line in (_cgroup / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
    return None


@contextlib.contextmanager
def cpu_recorded(test_id: str, asked_at: float) -> Iterator[None]:
    """Append the test's CPU and wall seconds to ``$TFRUN_TESTS_CPU_LOG``, if set, with
    its worker, when it started (``time.time()``), how long it waited for its turn before
    that (since ``asked_at``: an ``alone`` test waits for the room to empty, a shared one
    for an ``alone`` test to end) and its id: ``CPU WALL WORKER STARTED WAITED ID``. The
    start times give the run's timeline (who idled when)."""
    log = os.environ.get(CPU_LOG_ENV)
    if not log:  # the usual case: read no cgroup file around every test
        yield
        return
    cpu_before, wall_before, started = _cpu_seconds(), time.monotonic(), time.time()
    try:
        yield
    finally:
        cpu_after = _cpu_seconds()
        if cpu_before is not None and cpu_after is not None:
            with open(log, "a") as out:
                out.write(f"{cpu_after - cpu_before:.1f} {time.monotonic() - wall_before:.1f}"
                          f" {WORKER} {started:.1f} {started - asked_at:.1f} {test_id}\n")


# --------------------------------------------------------------------------- made once


#: What ``made_once`` made in this process, by name.
_made: dict[str, Path] = {}


def made_once(name: str, tmp_path_factory, make: Callable[[Path], None]) -> Path:
    """The directory ``name`` that ``make(directory)`` filled, made once for the whole
    session: by whichever worker asks first, the others waiting for it (under ``-n``), or
    in a new directory of ``tmp_path_factory`` when tests run one at a time. Later calls
    in the same process return it at once.

    A ``make`` that fails (raises) leaves nothing marked made: the next test that asks
    tries again, and fails the same way, as one reference failing every test that needs it
    should."""
    if name not in _made:
        _made[name] = _make_shared_once(name, make) if _shared() else _make_here(
            name, tmp_path_factory, make)
    return _made[name]


def _make_here(name: str, tmp_path_factory, make: Callable[[Path], None]) -> Path:
    directory = tmp_path_factory.mktemp(name)
    make(directory)
    return directory


def _make_shared_once(name: str, make: Callable[[Path], None]) -> Path:
    shared = _shared()
    directory = shared / "made" / name
    directory.parent.mkdir(exist_ok=True)
    with open(shared / "made" / f"{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / ".made").exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            started = time.monotonic()
            make(directory)
            (directory / ".made").write_text(f"{WORKER} {time.monotonic() - started:.1f}s\n")
    return directory
