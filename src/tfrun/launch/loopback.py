"""The default network of a local cluster: the tasks' ports on this machine's loopback only.

TensorFlow's gRPC server binds every interface and authenticates nobody. A local cluster
only talks over loopback, so tfrun loads a small library into its tasks
(``_loopback_bind.c``, through ``LD_PRELOAD``) that turns a bind to "every interface" into
a bind to ``127.0.0.1`` (``::ffff:127.0.0.1`` / ``::1`` for IPv6 sockets). Nothing else
changes: the tasks reach this machine's ``127.0.0.1`` services and the outside world as
any process does, and need no system package (unlike a private namespace, which needs
``slirp4netns`` for outbound traffic and hides this machine's loopback behind 10.0.2.2).

tfrun ships the library built for x86_64 (``_loopback_bind.x86_64.so``, made by
``scripts/build_loopback_bind.sh``; it needs only glibc 2.2.5's symbols) and uses it when it
was built from the current source (its ``.sha256``); elsewhere the source is compiled once
per machine with ``$CC`` (else ``cc``/``gcc``) into tfrun's private cache
(``tfrun.native_cache``); ``contract.LOOPBACK_BIND=build`` always compiles, ``=off`` uses
no library (``--network auto`` then falls back). What it does not cover: a program that makes the ``bind`` system
call without the C library (static binaries, Go), and processes that clear
``LD_PRELOAD``; TensorFlow and Python do neither.

    >>> network = LoopbackNetwork(Path("/cache/loopback_bind-1.so"))
    >>> network.task_env({"LD_PRELOAD": "libjemalloc.so"})["LD_PRELOAD"]
    '/cache/loopback_bind-1.so:libjemalloc.so'
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

from .. import contract, native_cache

__all__ = ["LoopbackNetwork", "LoopbackUnavailable", "shipped_library"]

SOURCE = Path(__file__).with_name("_loopback_bind.c")
_CHOICES = ("shipped", "build", "off")


class LoopbackUnavailable(RuntimeError):
    """The bind library cannot be built or used here; the message says why and the fix."""


class LoopbackNetwork:
    """Tasks whose listening sockets stay on loopback: ``task_env`` is what a task needs."""

    def __init__(self, library: Path) -> None:
        self.library = library

    @classmethod
    def create(cls, environ=None,
               announce: Callable[[str], None] | None = None) -> LoopbackNetwork:
        """Build (once per machine) or find the library, or raise LoopbackUnavailable."""
        environ = os.environ if environ is None else environ
        if not os.uname().sysname == "Linux":
            raise LoopbackUnavailable("the loopback bind library is built for Linux")
        how = environ.get(contract.LOOPBACK_BIND, "shipped") or "shipped"
        if how not in _CHOICES:
            raise LoopbackUnavailable(f"{contract.LOOPBACK_BIND}={how!r} is not one of "
                                      f"{', '.join(_CHOICES)}")
        if how == "off":
            raise LoopbackUnavailable(f"{contract.LOOPBACK_BIND}=off")
        shipped = shipped_library() if how == "shipped" else None
        if shipped is not None:
            return cls(shipped)
        compiler = _compiler(environ)
        if compiler is None:
            raise LoopbackUnavailable("no C compiler to build the loopback bind library "
                                      "(install gcc, or set CC)")
        try:
            library = native_cache.build_once(
                "loopback_bind", [SOURCE.read_bytes(), compiler.encode()],
                lambda out: [compiler, "-shared", "-fPIC", "-O2", "-w", str(SOURCE), "-o", out,
                             "-ldl"],
                what="the loopback bind library for local clusters", environ=environ,
                announce=announce)
        except (OSError, RuntimeError) as exc:
            raise LoopbackUnavailable(f"cannot build the loopback bind library: {exc}") from None
        return cls(library)

    def task_env(self, environ=None) -> dict[str, str]:
        """The variables a task starts with: the library first in ``LD_PRELOAD`` (the user's
        own preloads kept after it), and where this machine's loopback is (itself)."""
        environ = os.environ if environ is None else environ
        preload = [str(self.library)]
        if environ.get("LD_PRELOAD"):
            preload.append(environ["LD_PRELOAD"])
        return {"LD_PRELOAD": ":".join(preload), contract.HOST_LOOPBACK: "127.0.0.1"}

    def close(self) -> None:
        """Nothing to undo: the library stays cached for the next run."""


def shipped_library(machine: str | None = None) -> Path | None:
    """The copy shipped for this architecture, if it was built from the current source."""
    machine = machine or os.uname().machine
    library = SOURCE.with_name(f"_loopback_bind.{machine}.so")
    digest = SOURCE.with_name(f"_loopback_bind.{machine}.sha256")
    try:
        built_from = digest.read_text().strip()
    except OSError:
        return None
    if not library.exists() or built_from != hashlib.sha256(SOURCE.read_bytes()).hexdigest():
        return None
    return library


def _compiler(environ) -> str | None:
    named = environ.get("CC")
    found = shutil.which(named) if named else (shutil.which("cc") or shutil.which("gcc"))
    # The real file names the build (cc is often a link to gcc-N): one cache entry per compiler.
    return os.path.realpath(found) if found else None
