"""The end of a helper process tfrun started: wait a while for it, then kill it.

    >>> import subprocess, sys
    >>> helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    >>> wait_or_kill(helper, timeout=0.1)
    -9
"""

from __future__ import annotations

import os
import signal
import subprocess

__all__ = ["wait_or_kill"]


def wait_or_kill(process: subprocess.Popen, timeout: float = 5.0, *, group: bool = False) -> int:
    """Wait up to ``timeout`` seconds for ``process`` to exit, then SIGKILL it (its whole
    process group when ``group``: a helper started in a session of its own, whose
    children must not outlive it) and reap it. Returns its exit code."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    try:
        if group:
            os.killpg(process.pid, signal.SIGKILL)
        else:
            process.kill()
    except (ProcessLookupError, PermissionError):
        pass
    return process.wait()
