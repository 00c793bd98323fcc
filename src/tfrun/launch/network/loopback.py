"""The default network of a local cluster: the tasks' ports on this machine's loopback only.

TensorFlow's gRPC server binds every interface and authenticates nobody. A local cluster
only talks over loopback, so tfrun loads a small library into its tasks
(``_loopback_bind.c``, through ``LD_PRELOAD``) that turns a bind to "every interface" into
a bind to ``127.0.0.1`` (``::ffff:127.0.0.1`` / ``::1`` for IPv6 sockets). Nothing else
changes: the tasks reach this machine's ``127.0.0.1`` services and the outside world as
any process does, and need no system package (unlike a private namespace, which needs
``slirp4netns`` for outbound traffic and hides this machine's loopback behind 10.0.2.2).

tfrun ships the library built for x86_64 (``_loopback_bind.x86_64.so``, made by
``scripts/build_loopback_bind.py`` with a pinned toolchain, byte for byte reproducible; it
needs only glibc 2.2.5's symbols). Its ``.sha256`` names the binary's hash and the source's
(``sha256sum -c`` format): tfrun uses the copy only when the source is the current one and
the binary is the one built from it -- a replaced binary is never loaded. Elsewhere the source
is compiled once per machine with ``$CC`` (else ``cc``/``gcc``), with the same flags, into
tfrun's private cache (``tfrun.native_cache``); ``contract.LOOPBACK_BIND=build`` always
compiles, ``=off`` uses no library (``--network auto`` then falls back). What it does not cover: a program that makes the ``bind`` system
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

from ... import contract, native_cache

__all__ = ["BUILD_FLAGS", "LoopbackNetwork", "LoopbackUnavailable", "ShippedLibraryReplaced",
           "compile_command", "shipped_library"]

SOURCE = Path(__file__).with_name("_loopback_bind.c")
_CHOICES = ("shipped", "build", "off")
#: Every build's flags, the shipped copy's and a user's machine's: no builtins (the
#: compiler cannot turn the byte loops into memcpy/memset calls, newer than glibc 2.2.5), and
#: no identifying strings or debug paths, so the pinned toolchain gives the same bytes.
BUILD_FLAGS = ("-shared", "-fPIC", "-O2", "-fno-builtin", "-fno-tree-loop-distribute-patterns",
               "-fno-ident", "-g0", "-Wl,--build-id=sha1")


def compile_command(compiler: str, source: Path | str, out: Path | str,
                    warnings: tuple[str, ...] = ("-w",)) -> list[str]:
    """The command that compiles ``source`` into the library ``out`` (on a user's machine
    warnings are off: a newer compiler's new warning must not stop the run).

    >>> compile_command("gcc", "b.c", "b.so")[-4:]
    ['-w', 'b.c', '-o', 'b.so']
    """
    return [compiler, *BUILD_FLAGS, *warnings, str(source), "-o", str(out)]


class ShippedLibraryReplaced(RuntimeError):
    """The shipped binary is not the one its ``.sha256`` names: it is never loaded."""


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
        shipped = None
        if how == "shipped":
            try:
                shipped = shipped_library()
            except ShippedLibraryReplaced as replaced:
                # Never load it; the source is still good, so a compiler can make a fresh copy.
                (announce or print)(f"tfrun: WARNING: {replaced}")
                if _compiler(environ) is None:
                    raise LoopbackUnavailable(str(replaced)) from None
        if shipped is not None:
            return cls(shipped)
        compiler = _compiler(environ)
        if compiler is None:
            raise LoopbackUnavailable("no C compiler to build the loopback bind library "
                                      "(install gcc, or set CC)")
        try:
            library = native_cache.build_once(
                "loopback_bind",
                [SOURCE.read_bytes(), compiler.encode(), *map(str.encode, BUILD_FLAGS)],
                lambda out: compile_command(compiler, SOURCE, out),
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


def shipped_library(machine: str | None = None, directory: Path | None = None) -> Path | None:
    """The copy shipped for this architecture (in ``directory``, by default tfrun's), if it
    was built from the current source; raises ShippedLibraryReplaced when the binary is not
    the one its ``.sha256`` names."""
    machine = machine or os.uname().machine
    directory = directory or SOURCE.parent
    library = directory / f"_loopback_bind.{machine}.so"
    try:
        recorded = dict(reversed(line.split()) for line in
                        (directory / f"_loopback_bind.{machine}.sha256").read_text().splitlines()
                        if line.strip())
        source = (directory / SOURCE.name).read_bytes()
    except (OSError, ValueError):
        return None
    if not library.exists() or recorded.get(SOURCE.name) != hashlib.sha256(source).hexdigest():
        return None  # none shipped here, or the source changed since (a developer's tree)
    actual = hashlib.sha256(library.read_bytes()).hexdigest()
    if recorded.get(library.name) != actual:
        raise ShippedLibraryReplaced(
            f"{library} is not the library tfrun shipped: its sha256 is {actual}, its "
            f".sha256 file names {recorded.get(library.name)}. It was replaced or damaged, and "
            "is not loaded. Reinstall tfrun, or rebuild it with "
            "scripts/build_loopback_bind.py (docs/security-and-network.md)")
    return library


def _compiler(environ) -> str | None:
    named = environ.get("CC")
    found = shutil.which(named) if named else (shutil.which("cc") or shutil.which("gcc"))
    # The real file names the build (cc is often a link to gcc-N): one cache entry per compiler.
    return os.path.realpath(found) if found else None
