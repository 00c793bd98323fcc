"""The tests' warm task starters (``tfrun.in_task.start.warm_starter``): per pytest process and
environment at import (Keras 3, tf_keras), started at the first local run that needs them,
which every later such run forks its tasks from.

Why: CPU is the suite's limit on two cores, and every local run's own task starter imported
TensorFlow and Keras once (6.5-13 CPU s here, about a quarter of the suite's CPU).
Two per environment: one for local clusters (its tasks load the loopback library) and one
for runs of a single task (theirs do not); a run is given both and the first that may serve
it does. A run they may not serve (another environment at import, a node agent in a fake
host's namespace -- ``tests/multihost/warm_hosts.py`` runs those their own --, a Slurm
step, a Ray worker) starts its own starter, as it would without them;
``tests/integration/test_forked_tasks.py`` tests both paths, and ``TFRUN_TESTS_WARM=0``
turns them off for a whole session.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["VARIABLE", "env", "for_run", "legacy_keras", "on", "stop"]

#: tfrun's variable for it (``tfrun.contract.WARM_STARTER``; spelled here, as conftest
#: spells tfrun's, because this module loads before any test's imports).
VARIABLE = "TFRUN_WARM_STARTER"

#: The warm starters of this process, by the variables each was started with beyond
#: os.environ (a run whose environment at import differs needs its own: tf_keras, ...) and
#: the runs it serves (``--runs``: a local cluster's tasks load the loopback library, a
#: single task's do not).
_started: dict[tuple, tuple[subprocess.Popen, Path]] = {}


def on() -> bool:
    """Runs get warm starters (``TFRUN_TESTS_WARM`` is not ``0``)."""
    return os.environ.get("TFRUN_TESTS_WARM", "1") != "0"


def legacy_keras(args: list[str], environ: dict[str, str]) -> bool:
    """Whether ``tfrun ARGS`` started with ``environ`` gives its tasks tf_keras (which a
    warm starter must have imported instead of Keras 3): ``--keras 2``, ``--keras=2``, the
    flag's variable ``TFRUN_KERAS=2`` or ``TF_USE_LEGACY_KERAS=1``.

    >>> legacy_keras(["--workers", "2", "--keras=2", "train.py"], {})
    True
    """
    flag = [v for k, v in zip(args, args[1:]) if k == "--keras"] \
        + [a.partition("=")[2] for a in args if a.startswith("--keras=")]
    return "2" in flag or environ.get("TFRUN_KERAS") == "2" \
        or environ.get("TF_USE_LEGACY_KERAS") == "1"


def for_run(args: list[str], environ: dict[str, str]) -> dict[str, str]:
    """``env()`` for a local ``tfrun ARGS`` started with ``environ``: the warm starters of its
    Keras flavour (tf_keras' when it gives its tasks tf_keras, else Keras 3's)."""
    return env({"TF_USE_LEGACY_KERAS": "1"} if legacy_keras(args, environ) else None)


def env(at_import: dict[str, str] | None = None) -> dict[str, str]:
    """``{VARIABLE: paths}`` for a local run's environment: the sockets of two warm starters
    started with ``os.environ`` and ``at_import`` (the variables the run's tasks have at
    import beyond this process's, e.g. ``{"TF_USE_LEGACY_KERAS": "1"}``) -- one for local
    clusters (the loopback library loaded), one for runs of a single task (without it) --
    started (and their sockets made) at the first call; ``{}`` when ``TFRUN_TESTS_WARM`` is
    ``0`` or they could not start."""
    if not on():
        return {}
    key = tuple(sorted((at_import or {}).items()))
    for runs in ("local", "single-task"):  # (they import side by side)
        _start(key, runs)
    ready = [path for path in (_ready(key, runs) for runs in ("local", "single-task"))
             if path is not None]
    return {VARIABLE: os.pathsep.join(ready)} if ready else {}


def _start(key: tuple, runs: str) -> None:
    """Start the warm starter for ``key`` and ``runs``, at the first call."""
    if (key, runs) not in _started:
        path = Path(tempfile.mkdtemp(prefix="warm-starter-")) / "socket"
        with open(path.parent / "warm-starter.log", "wb") as log:
            _started[key, runs] = (subprocess.Popen(
                [sys.executable, "-m", "tfrun.launch.processes.warm_starter", "--runs", runs,
                 "--ignore-env", "PYTEST_CURRENT_TEST", str(path)],
                env={**os.environ, **dict(key), "TFRUN_SUPERVISOR_PID": str(os.getpid())},
                cwd=str(Path(__file__).resolve().parent.parent), stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True), path)


def _ready(key: tuple, runs: str) -> str | None:
    """The socket of the warm starter for ``key`` and ``runs`` once it listens, or None."""
    process, path = _started[key, runs]
    deadline = time.monotonic() + 180  # (three importing at once on a slow hour)
    while not path.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return str(path) if process.poll() is None and path.exists() else None


def stop() -> None:
    """End the warm starters (their run starters and those's tasks die with them)."""
    for process, _path in _started.values():
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process, path in _started.values():
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        shutil.rmtree(path.parent, ignore_errors=True)  # its log (the socket went with it)
    _started.clear()
