"""Task output: per-task log files, a prefixed live console, and traceback extraction.

Every line a task prints goes, unfiltered, to ``<run_dir>/logs/<role>-<i>.log``. The
console gets the same line prefixed with its task (``[worker:1] ...``, coloured on a
TTY), unless the task is filtered out (``--show``/``--quiet-tasks``) or the line is
TensorFlow start-up noise (oneDNN, CUDA stubs, absl INFO/WARNING lines), which stays in
the files only unless ``--tf-noise`` is given.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable

__all__ = ["ConsoleSink", "NoiseFilter", "TaskLogger", "describe_write_error", "is_tf_noise",
           "last_traceback", "parse_task_filter"]

_NOISE_PATTERNS = [
    r"oneDNN custom operations are on",
    r"cudart_stub\.cc",
    r"cuda_(platform|executor|dnn|fft|blas)\.cc",
    r"Could not find cuda drivers",
    r"failed call to cuInit",
    r"TF-TRT Warning",
    r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered",
    r"This TensorFlow binary is optimized to use available CPU instructions",
    r"To enable the following instructions: ",
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"cpu_feature_guard\.cc",
    r"Skipping registering GPU devices",
    # absl-formatted INFO/WARNING lines: "I0000 00:00:1795239234.920417    2276 file.cc:31] ..."
    r"^[IW]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ \S+:\d+\]",
    # Python-side TF INFO logging ("INFO:tensorflow:...") is chatty under strategies.
    r"^INFO:tensorflow:",
    # Keras 3 warns about its own default shuffle=True whenever fit() gets a tf.data.Dataset.
    r"`shuffle=True` was passed, but will be ignored since the data `x` was provided as a tf\.data",
    r"^\s+self\.data_adapter = data_adapters\.get_data_adapter\($",
]
_NOISE = re.compile("|".join(f"(?:{p})" for p in _NOISE_PATTERNS))


def is_tf_noise(line: str) -> bool:
    """True for TensorFlow start-up/runtime chatter that the console hides by default.

    >>> is_tf_noise("I0000 00:00:1795.9 2276 cudart_stub.cc:31] Could not find cuda drivers")
    True
    >>> is_tf_noise("Epoch 1/2")
    False
    """
    return bool(_NOISE.search(line))


_PROTO_CONTINUATION = re.compile(
    r'^\s*(\}|[a-z_][a-z0-9_]* \{|[a-z_][a-z0-9_]*: ("[^"]*"|-?[0-9.e+-]+|true|false|[A-Z][A-Z0-9_]*))?\s*$')


class NoiseFilter:
    """Stateful ``is_tf_noise`` for one task's stream: TensorFlow sometimes logs a
    multi-line message (e.g. a SessionOptions proto dump after an absl INFO line); its
    continuation lines carry no prefix, so they are noise when they follow a noise line
    and look like proto text.

    >>> f = NoiseFilter()
    >>> [f(l) for l in ["I0000 00:00:1.0 1 e.cc:3] SessionOptions:", "device_count {", "  value: 1",
    ...                 "}", "MirroredStrategy: 2 replicas"]]
    [True, True, True, True, False]
    """

    def __init__(self) -> None:
        self._in_block = False

    def __call__(self, line: str) -> bool:
        if is_tf_noise(line):
            self._in_block = True
            return True
        if self._in_block and _PROTO_CONTINUATION.match(line):
            return True
        self._in_block = False
        return False


_COLORS = ["36", "33", "35", "32", "34", "91", "96", "93"]


def parse_task_filter(text: str | None) -> frozenset[str] | None:
    """``"chief,worker:0"`` -> the set of roles / role:index shown; None shows all."""
    if text is None or text.strip() in ("", "all"):
        return None
    return frozenset(part.strip() for part in text.split(",") if part.strip())


class ConsoleSink:
    """Writes prefixed lines to one stream from many threads, whole lines at a time."""

    def __init__(self, stream: IO[str] | None = None, *, color: bool | None = None,
                 show: frozenset[str] | None = None, quiet: bool = False,
                 tf_noise: bool = False) -> None:
        self.stream = stream or sys.stdout
        self.color = self.stream.isatty() if color is None else color
        self.show = show
        self.quiet = quiet
        self.tf_noise = tf_noise
        self._lock = threading.Lock()

    def visible(self, task: str) -> bool:
        if self.quiet:
            return False
        if self.show is None:
            return True
        return task in self.show or task.split(":")[0] in self.show

    def task_line(self, task: str, color_index: int, line: str, noise: bool | None = None) -> None:
        """Show one line of ``task`` (``noise``: the caller's stateful verdict, if any)."""
        if noise is None:
            noise = is_tf_noise(line)
        if not self.visible(task) or (noise and not self.tf_noise):
            return
        prefix = f"[{task}]"
        if self.color:
            prefix = f"\x1b[{_COLORS[color_index % len(_COLORS)]}m{prefix}\x1b[0m"
        self.write(f"{prefix} {line}")

    def info(self, text: str) -> None:
        """A tfrun message (always shown)."""
        prefix = "\x1b[1mtfrun:\x1b[0m" if self.color else "tfrun:"
        for line in text.splitlines() or [""]:
            self.write(f"{prefix} {line}")

    def write(self, text: str) -> None:
        with self._lock:
            try:
                self.stream.write(text.rstrip("\n") + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # closed, broken pipe, disk full: keep going
                pass


@dataclass
class TaskLogger:
    """Copies one task's output stream to its log file and the console (one thread).

    The stream is drained to its end whatever happens to the file: a task blocked
    writing to a full pipe would hang the run. When the file cannot be written (disk
    full, ...), the copy goes on to the console only and ``write_error`` says why.
    """

    task: str
    color_index: int
    path: Path
    console: ConsoleSink
    _threads: list[threading.Thread] = field(default_factory=list)
    #: The first error writing the log file (None while all is well).
    write_error: OSError | None = None
    #: time.monotonic() of the last line (or of the start): the hang watchdog reads it.
    last_line_at: float = field(default_factory=time.monotonic)
    #: lines read since the start of the run (to find the lines after a mark)
    lines_read: int = 0
    _recent: deque = field(default_factory=lambda: deque(maxlen=400))
    _recent_lock: threading.Lock = field(default_factory=threading.Lock)

    def pump(self, stream: IO[bytes]) -> threading.Thread:
        """Start copying ``stream`` until EOF; the log file is appended to (restarts)."""
        self.last_line_at = time.monotonic()
        thread = threading.Thread(target=self._copy, args=(stream,), daemon=True,
                                  name=f"tfrun-log-{self.task}")
        thread.start()
        self._threads.append(thread)
        return thread

    def _copy(self, stream: IO[bytes]) -> None:
        noise = NoiseFilter()
        log = self._open_log()
        try:
            for raw in iter(stream.readline, b""):
                if log is not None:
                    try:
                        log.write(raw)
                    except OSError as exc:
                        self._failed(exc)
                        _close_quietly(log)
                        log = None
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                self.last_line_at = time.monotonic()
                with self._recent_lock:
                    self._recent.append(line)
                    self.lines_read += 1
                self.console.task_line(self.task, self.color_index, line, noise=noise(line))
        finally:
            _close_quietly(log)
            stream.close()

    def _open_log(self) -> IO[bytes] | None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            return open(self.path, "ab", buffering=0)
        except OSError as exc:
            self._failed(exc)
            return None

    def _failed(self, exc: OSError) -> None:
        if self.write_error is None:
            self.write_error = exc

    def lines_since(self, mark: int) -> list[str]:
        """The lines read after ``lines_read`` was ``mark`` (the last 400 at most)."""
        with self._recent_lock:
            recent, count = list(self._recent), self.lines_read
        return recent[max(len(recent) - (count - mark), 0):]

    def join(self, timeout: float = 5.0) -> None:
        for thread in self._threads:
            thread.join(timeout)
        self._threads = [t for t in self._threads if t.is_alive()]


def _close_quietly(log: IO[bytes] | None) -> None:
    if log is not None:
        try:
            log.close()
        except OSError:  # the last buffered bytes could not be written either
            pass


def describe_write_error(path: Path | str, exc: OSError) -> str:
    """``disk full: cannot write <path> (...)`` or the plain error for other causes.

    >>> import errno
    >>> describe_write_error("runs/x/logs/w.log", OSError(errno.ENOSPC, "No space left on device"))
    'disk full: cannot write runs/x/logs/w.log (No space left on device)'
    """
    import errno

    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return f"{'disk full: ' if full else ''}cannot write {path} ({exc.strerror or exc})"


_ABSL_LINE = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d+\.\d+\s+\d+ ")


def last_traceback(lines: Iterable[str], max_lines: int = 80) -> str | None:
    """The last Python traceback in ``lines`` (with its exception line), or None.

    >>> log = ["hello", "Traceback (most recent call last):", '  File "x.py", line 1',
    ...        "    boom()", "ValueError: bad", "I0000 00:00:1.0 1 x.cc:1] noise"]
    >>> print(last_traceback(log))
    Traceback (most recent call last):
      File "x.py", line 1
        boom()
    ValueError: bad
    """
    lines = [line.rstrip("\n") for line in lines]
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:
        return None
    # Include chained exceptions ("During handling ...") by starting at the first
    # traceback of the final chain.
    start = starts[-1]
    for earlier in reversed(starts[:-1]):
        gap = lines[earlier:start]
        if any(l.startswith(("During handling of the above exception",
                             "The above exception was the direct cause")) for l in gap):
            start = earlier
        else:
            break
    out: list[str] = []
    for line in lines[start:]:
        if _ABSL_LINE.match(line) or is_tf_noise(line):
            if out and not out[-1].startswith((" ", "Traceback")):
                break
            continue
        out.append(line)
        if len(out) >= max_lines:
            out.append("... (truncated; see the log file)")
            break
    # Trim trailing chatter after the exception line: stop after the first non-indented
    # line that follows the last frame.
    end = len(out)
    for i in range(len(out) - 1, 0, -1):
        if out[i - 1].startswith(" ") and not out[i].startswith(" "):
            end = i + 1
            break
    return "\n".join(out[:end])
