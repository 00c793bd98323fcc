"""Joining what the launcher prepared for this task: its cgroup and the run's private network.

The bootstrap calls these first thing, while the process is still single-threaded (a
thread-ed process cannot join a user namespace), before any of the user's code runs. Each
raises OSError when it cannot join: the caller must then not run the task at all, since
it would outlive the run (no cgroup) or serve on the host's network (no namespace).

    >>> join_cgroup({})      # nothing asked for: nothing done
    >>> join_network({})
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from ... import contract

__all__ = ["CLONE_NEWNET", "CLONE_NEWUSER", "check", "join_cgroup", "join_network", "libc"]

CLONE_NEWNET, CLONE_NEWUSER = 0x40000000, 0x10000000


def libc():
    """The C library, with errno kept for ``check``."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def check(result: int, what: str) -> None:
    """Raise OSError (with errno's text) when a libc call returned non-zero."""
    if result != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def join_cgroup(environ: Mapping[str, str] = os.environ) -> None:
    """Move this process into the cgroup named by ``contract.CGROUP``, if any."""
    path = environ.get(contract.CGROUP)
    if path:
        Path(path, "cgroup.procs").write_text("0")  # "0": the writing process itself


def join_network(environ: Mapping[str, str] = os.environ) -> None:
    """Join the run's private network (``contract.NETNS``, and ``contract.USERNS`` when the
    launcher was not root), if tfrun asked for it."""
    netns = environ.get(contract.NETNS)
    if not netns:
        return
    lib = libc()
    userns = environ.get(contract.USERNS)
    if userns:
        fd = os.open(userns, os.O_RDONLY)
        try:
            check(lib.setns(fd, CLONE_NEWUSER), f"setns({userns})")
        finally:
            os.close(fd)
    fd = os.open(netns, os.O_RDONLY)
    try:
        check(lib.setns(fd, CLONE_NEWNET), f"setns({netns})")
    finally:
        os.close(fd)
