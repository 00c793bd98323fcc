"""One holder at a time for each engine the tests share (the fake hosts, Slurm, Ray),
whatever the test scheduler does.

An engine's ``up`` sweeps what an earlier holder left and its ``down`` removes every
namespace, daemon and file of its kind: two holders at once would kill each other's
engine mid-test. pytest-xdist's ``--dist loadgroup`` keeps each engine's tests on one
worker, but that is a scheduling hint that a pytest or xdist release can drop (pytest 9
with xdist 3.8 ignores every ``xdist_group`` mark), and two pytest sessions on one machine
never see each other's hints. So each engine is also held under an exclusive ``flock``
on a file named after it, for as long as it is up: a second holder (another worker, or
another session) waits for the first to bring it down, and fails with the first one's
pid and test if that takes longer than ``WAIT_S``.

    >>> with held("ray"):  # doctest: +SKIP
    ...     ray_cluster.up(); ...; ray_cluster.down()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

#: Where the locks live: machine-wide (not a worker's TMPDIR), and root's /run/lock when
#: it is writable so that a session with another TMPDIR meets the same file.
LOCK_DIR = Path("/run/lock") if os.access("/run/lock", os.W_OK) else Path("/tmp")
#: How long a second holder waits before it fails naming the first (below pytest-timeout's
#: 600 s, so that the failure says who held it rather than only "timeout").
WAIT_S = 540.0


class EngineBusy(RuntimeError):
    """Another process held the engine for longer than the wait."""


def lock_path(name: str) -> Path:
    return LOCK_DIR / f"tfrun-tests-engine-{name}.lock"


@contextlib.contextmanager
def held(name: str, wait_s: float = WAIT_S) -> Iterator[None]:
    """Hold engine ``name`` exclusively for the ``with`` block (across processes).

    Reentrant use in one process would wait on itself: each engine is held by one
    fixture only. The lock goes with the process, so a holder killed mid-test frees it.
    """
    path = lock_path(name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    holder = os.pread(fd, 512, 0).decode(errors="replace").strip()
                    raise EngineBusy(
                        f"the test engine {name!r} was still held after {wait_s:.0f} s by "
                        f"{holder or 'an unknown process'} ({path}); expected it free. Fix: "
                        "let that session end, or kill it if it is a leftover") from None
                time.sleep(0.2)
        who = f"pid {os.getpid()} ({os.environ.get('PYTEST_CURRENT_TEST', 'no test')})"
        os.ftruncate(fd, 0)
        os.pwrite(fd, who.encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def engine_while_needed(name: str, helper: ModuleType, value: Callable[[], object],
                        lock: str | None = None) -> Iterator[object]:
    """A fixture's body: hold engine ``lock`` (default ``name``), bring it up
    (``helper.up()``), yield ``value()``, bring it down (``helper.down()``), release it.

    Skips with the reason (``helper.unavailable()``) where it cannot run, and fails
    instead under CI, which must run every engine's tests.

        >>> yield from engine_while_needed("Ray", ray_cluster, lambda: ADDRESS)  # doctest: +SKIP
    """
    reason = helper.unavailable()
    if reason:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the {name} tests, but: {reason}")
        pytest.skip(reason)
    with held(lock or name.lower()):
        try:
            helper.up()
        except RuntimeError as exc:
            pytest.fail(str(exc))
        try:
            yield value()
        finally:
            helper.down()
