"""``tfrun --tensorboard``: TensorBoard on the run dir's ``tensorboard/`` for the run's duration.

Scripts write there with ``tfrun.tensorboard_dir()`` (the chief; other tasks get a
private directory). TensorBoard serves on 127.0.0.1 only (it has no authentication), on a
free port found like the tasks' ports, printed at start; it dies with the launch: stopped
at the end of the run, and killed by the kernel if tfrun itself is killed (it runs under
``python -m tfrun.launch.results.tensorboard``, which sets ``PR_SET_PDEATHSIG`` and then execs
TensorBoard). Its output goes to ``logs/tensorboard.log``.

    with TensorBoardServer.start(run_dir, console):
        ...   # the run
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...errors import ConfigError
from ..network.ports import PortReservation

__all__ = ["TensorBoardServer", "require_tensorboard"]


def require_tensorboard() -> None:
    """A ConfigError (before anything starts) when TensorBoard is not installed."""
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("--tensorboard needs TensorBoard, which is not installed here",
                          expected="the tensorboard package (TensorFlow 2.21 no longer "
                                   "installs it)",
                          fix="pip install tensorboard (or 'tfrun[examples]'), or drop "
                              "--tensorboard", received="import tensorboard: not found")


class TensorBoardServer:
    """A running TensorBoard; ``stop()`` (or leaving the ``with``) ends it."""

    def __init__(self, process: subprocess.Popen, url: str) -> None:
        self.process = process
        self.url = url

    @classmethod
    def start(cls, run_dir: Path, console, host: str = "127.0.0.1") -> TensorBoardServer:
        logdir = run_dir / "tensorboard"
        logdir.mkdir(exist_ok=True)
        (run_dir / "logs").mkdir(exist_ok=True)
        reservation = PortReservation.reserve(1, host)
        port = reservation.ports[0]
        # TensorBoard binds without SO_REUSEPORT: the port is let go just before it starts.
        reservation.close()
        log = open(run_dir / "logs" / "tensorboard.log", "ab")
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "tfrun.launch.results.tensorboard", str(os.getpid()),
                 "--logdir", str(logdir), "--host", host, "--port", str(port),
                 "--reload_interval", "5"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        finally:
            log.close()
        server = cls(process, f"http://{host}:{port}/")
        console.info(f"tensorboard: {server.url} (logdir {logdir}; stops when the run ends)")
        return server

    def stop(self, grace: float = 5.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.process.poll() is None:
            time.sleep(0.05)
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def __enter__(self) -> TensorBoardServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _main(argv: list[str]) -> None:
    """``python -m tfrun.launch.results.tensorboard PARENT_PID [tensorboard args]``: die with the
    launcher, then become TensorBoard."""
    import ctypes

    parent = int(argv[0])
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the launcher died before the prctl
        os._exit(1)
    os.execv(sys.executable, [sys.executable, "-m", "tensorboard.main", *argv[1:]])


if __name__ == "__main__":
    _main(sys.argv[1:])
