"""Compile a source file that ships with tfrun once per machine, into a private cache.

Both sides use it: the task side builds the native shared-memory exchange
(``in_task/exchange/_native.py``), the launcher builds the loopback bind library
(``launch/network/loopback.py``). The cache is ``contract.CACHE_DIR`` (else ``$XDG_CACHE_HOME/tfrun``,
else ``~/.cache/tfrun``); a build is named after a hash of everything that shapes it, so a
later run, or another process of this one, loads it from there. Processes that start
together build it once (a file lock); a reader never sees half a file (written aside, then
renamed). What is loaded into a task must be private to this user (``check_private``).

    >>> cache_dir({contract.CACHE_DIR: "/scratch/tfrun"})
    PosixPath('/scratch/tfrun')
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from . import contract

__all__ = ["BUILD_TIMEOUT", "build_once", "cache_dir", "check_private"]

BUILD_TIMEOUT = 600


def cache_dir(environ=None) -> Path:
    environ = os.environ if environ is None else environ
    if environ.get(contract.CACHE_DIR):
        return Path(environ[contract.CACHE_DIR])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfrun"


def check_private(path: Path) -> None:
    """Raise OSError unless only this user may have written ``path``: what is built here is
    loaded into the tasks, so another user's file would run its code in every task."""
    status = path.stat()
    if status.st_uid != os.getuid() or status.st_mode & 0o022:
        raise OSError(f"{path} is not private to this user (owner uid {status.st_uid}, mode "
                      f"{status.st_mode & 0o777:o}): set {contract.CACHE_DIR} to a directory only "
                      "you can write")


def build_once(stem: str, key_parts: Sequence[bytes], command: Callable[[str], list[str]], *,
               what: str, environ=None, announce: Callable[[str], None] | None = None) -> Path:
    """The built file ``<cache>/<stem>-<hash of key_parts>.so``, building it first if needed
    with ``command(output_path)``; ``announce`` (default: print) says that a build starts and
    how long it took, ``what`` naming it. Raises OSError (cache not private) or RuntimeError
    (the build failed, its message ending the compiler's)."""
    announce = announce or (lambda line: print(line, flush=True))
    key = hashlib.sha256(b"\0".join(key_parts)).hexdigest()[:16]
    cache = cache_dir(environ)
    target = cache / f"{stem}-{key}.so"
    cache.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_private(cache)
    if target.exists():
        check_private(target)
        return target
    with open(cache / f"{stem}-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the others wait for one build
        if target.exists():
            return target
        # Said once, by the process that builds: a first run is slower by the build, and
        # nothing else would say why.
        announce(f"tfrun: building {what} (once per machine; cached in {cache})")
        started = time.monotonic()
        fd, partial = tempfile.mkstemp(prefix=target.name, suffix=".partial", dir=cache)
        os.close(fd)
        try:
            argv = command(partial)
            build = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
            if build.returncode != 0:
                raise RuntimeError(f"{Path(argv[0]).name} failed: "
                                   f"{(build.stderr or build.stdout).strip()[-1500:]}")
            os.replace(partial, target)  # whole or not at all
            announce(f"tfrun: built {what} in {time.monotonic() - started:.1f}s")
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return target
