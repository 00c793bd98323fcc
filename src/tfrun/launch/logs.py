"""Task output: per-task log files, a prefixed live console, and traceback extraction.

Every line a task prints goes, unfiltered, to ``<run_dir>/logs/<role>-<i>.log``. The
console gets the same line prefixed with its task (``[worker:1] ...``, coloured on a
TTY), unless the task is filtered out (``--show``/``--quiet-tasks``) or the line is
TensorFlow start-up noise (oneDNN, CUDA stubs, absl INFO/WARNING lines), which stays in
the files only unless ``--tf-noise`` is given.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Callable, Iterable

from ..contract import DEVICES_REPLACED, METRICS_LINE

__all__ = ["LEAD_AUTO", "ConsoleSink", "NoiseFilter", "OutputSplitter", "TaskLogger", "describe_write_error",
           "is_keras_progress", "is_tf_noise", "last_traceback", "parse_task_filter", "read_chunks",
           "replaced_device_count", "strip_ansi"]

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
    r'^\s*(\}|[a-z_][a-z0-9_]* \{|[a-z_][a-z0-9_]*: ("[^"]*"|-?[0-9.e+-]+|true|false|[A-Z][A-Z0-9_]*))?\s*$'
    # Other continuations of TensorFlow's multi-line log messages: the task list after
    # "Example stragglers:", type inference's "while inferring type of node '...'".
    r"|^/job:[\w/:.-]+$|^\s*while inferring type of node ")


# TensorFlow's coordination service reports a peer that has *exited* as crashed ("stopped
# sending heartbeats ... The tasks have crashed") and a leader that has exited as unreachable
# ("Failed to send RPC to coordination service"). After a peer's clean exit that is a false
# alarm; when a peer really failed (or training still needed it) the error surfaces anyway,
# in a Python traceback and the failure summary.
_PEER_LEFT = re.compile(r"^E\d{4} .*\] BaseCollectiveExecutor::StartAbort \w+: .*"
                        r"(stopped sending heartbeats|Failed to send RPC to coordination service)")
_PEER_LEFT_CONTINUATION = re.compile(
    r"^(/job:\S+$|The tasks have crashed\. |Additional GRPC error information |"
    r":UNKNOWN:Error received from peer )")


class NoiseFilter:
    """Stateful ``is_tf_noise`` for one task's stream: TensorFlow sometimes logs a
    multi-line message (e.g. a SessionOptions proto dump after an absl INFO line); its
    continuation lines carry no prefix, so they are noise when they follow a noise line
    and look like proto text.

    >>> f = NoiseFilter()
    >>> [f(l) for l in ["I0000 00:00:1.0 1 e.cc:3] SessionOptions:", "device_count {", "  value: 1",
    ...                 "}", "MirroredStrategy: 2 replicas"]]
    [True, True, True, True, False]
    >>> [f(l) for l in ["I0000 00:00:1.0 1 c.cc:505] Example stragglers:",
    ...                 "/job:worker/replica:0/task:1", "Epoch 1/2"]]
    [True, True, False]

    ``peers_left_cleanly`` (the supervisor's view: a peer exited 0 and none failed) also
    hides TensorFlow's "a peer crashed" alarm, which a clean exit of a peer sets off.
    """

    def __init__(self, peers_left_cleanly: Callable[[], bool] | None = None) -> None:
        self._in_block = False
        self._in_alarm = False
        self._peers_left_cleanly = peers_left_cleanly

    def __call__(self, line: str) -> bool:
        if self._in_alarm and _PEER_LEFT_CONTINUATION.match(line):
            return True
        self._in_alarm = False
        if (self._peers_left_cleanly is not None and _PEER_LEFT.match(line)
                and self._peers_left_cleanly()):
            self._in_alarm = True
            return True
        if is_tf_noise(line):
            self._in_block = True
            return True
        if self._in_block and _PROTO_CONTINUATION.match(line):
            return True
        self._in_block = False
        return False


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    r"""``text`` without terminal escape sequences (colours, cursor moves).

    >>> strip_ansi("\x1b[1m 1/8\x1b[0m loss: 0.5")
    ' 1/8 loss: 0.5'
    """
    return _ANSI.sub("", text)


def _final_text(raw: bytes) -> str:
    r"""What a terminal would show for one line: the last ``\r`` segment, without ``\b``."""
    text = raw.decode("utf-8", errors="replace").rstrip("\r\n").replace("\b", "")
    segments = [seg for seg in text.split("\r") if seg.strip()]
    return segments[-1] if segments else ""


_METRICS = METRICS_LINE.encode()


class OutputSplitter:
    r"""Splits a task's raw output into complete lines, live progress updates and metrics.

    Keras' progress bar (``verbose=1``) redraws one line with ``\r`` (and ``\b``) and only
    ends it with a newline at the end of the epoch. ``feed`` returns ``("line", text)`` for
    each complete line (the text a terminal would show), ``("progress", text)`` for the
    newest update of a line still being redrawn, and ``("metrics", json)`` for each
    ``tfrun:metrics {json}`` record, taken out of the stream wherever it stands (a task's
    sampler thread may print one in the middle of a progress line).

    >>> s = OutputSplitter()
    >>> s.feed(b"Epoch 1/2\n\r 1/8 loss: 0.9")
    [('line', 'Epoch 1/2'), ('progress', ' 1/8 loss: 0.9')]
    >>> s.feed(b'tfrun:metrics {"event": "log"}\n\x08\x08\r 8/8 loss: 0.5\n')
    [('metrics', '{"event": "log"}'), ('line', ' 8/8 loss: 0.5')]
    """

    #: A line longer than this (no newline) is passed on as a line anyway.
    MAX_PENDING = 1 << 16

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        events: list[tuple[str, str]] = []
        buffer = self._pending + data
        held = b""  # a record whose newline has not come yet: kept whole for the next feed
        while (marker := buffer.find(_METRICS)) >= 0:
            end = buffer.find(b"\n", marker)
            if end < 0:
                buffer, held = buffer[:marker], buffer[marker:]
                break
            events.append(("metrics", buffer[marker + len(_METRICS):end].decode(
                "utf-8", errors="replace")))
            buffer = buffer[:marker] + buffer[end + 1:]
        start = 0
        while (newline := buffer.find(b"\n", start)) >= 0:
            events.append(("line", _final_text(buffer[start:newline + 1])))
            start = newline + 1
        pending = buffer[start:]
        if b"\r" in pending:
            # Only the newest redraw matters: keep it (from its \r) and show it.
            pending = pending[pending.rindex(b"\r"):]
            text = _final_text(pending)
            if text:
                events.append(("progress", text))
        if len(pending) + len(held) > self.MAX_PENDING:
            events.append(("line", _final_text(pending + held)))
            pending = held = b""
        self._pending = pending + held
        return events

    def close(self) -> list[tuple[str, str]]:
        """The unterminated last line, if any."""
        pending, self._pending = self._pending, b""
        text = _final_text(pending)
        return [("line", text)] if text else []


def read_chunks(stream: IO[bytes], size: int = 1 << 16) -> Iterable[bytes]:
    """Whatever ``stream`` has, as soon as it has it (not line by line), until EOF."""
    read = getattr(stream, "read1", None) or stream.read
    while chunk := read(size):
        yield chunk


_COLORS = ["36", "33", "35", "32", "34", "91", "96", "93"]


def parse_task_filter(text: str | None) -> frozenset[str] | None:
    """``"chief,worker:0"`` -> the set of roles / role:index shown; None shows all."""
    if text is None or text.strip() in ("", "all"):
        return None
    return frozenset(part.strip() for part in text.split(",") if part.strip())


#: Keras' own progress output: "Epoch 2/5", and the step lines of verbose=1 and 2, in
#: Keras 3 (" 8/8 ━━━━ 0s 16ms/step - loss: ...", "8/8 - 0s - 16ms/step - ...") and tf_keras
#: ("8/8 [=====] - 0s 16ms/step - ...", "8/Unknown - ...").
_KERAS_PROGRESS = re.compile(r"^\s*(Epoch \d+/\d+\s*$|\d+/(\d+|Unknown)\s+(━|\[|-\s))")


def is_keras_progress(line: str) -> bool:
    """True for a line of Keras' own progress output (see ``_KERAS_PROGRESS``).

    >>> [is_keras_progress(l) for l in ["Epoch 1/3", " 8/8 ━━━━━━ 0s 2ms/step - loss: 0.5",
    ...  "8/8 [======] - 0s 2ms/step", "8/8 - 0s - 2ms/step - loss: 0.5", "epoch 1 done"]]
    [True, True, True, True, False]
    """
    return bool(_KERAS_PROGRESS.match(strip_ansi(line)))


#: ``ConsoleSink(lead=LEAD_AUTO)``: the supervisor names the lead task (chief, else worker 0).
LEAD_AUTO = "auto"


class ConsoleSink:
    r"""Writes prefixed lines to one stream from many threads, whole lines at a time.

    On a live terminal (``live``, default: the stream is a TTY) the bottom of the screen
    holds a redrawn region: the newest progress update of a task (Keras' ``verbose=1`` bar,
    prefixed) and, once the supervisor sets one, a status line (``set_status``). Other lines
    are written above it. Without a terminal there is no region: progress updates are left
    out (the line that ends a bar still comes) and so is the status line. Without colour,
    terminal escapes are stripped from task lines.

    ``lead`` (a task name, e.g. ``worker:0``): only that task's Keras progress -- the
    "Epoch n/N" lines, step lines and live bars -- is shown; every other task prints the
    same progress, which stays in its log file. Everything else every task prints is shown.
    """

    def __init__(self, stream: IO[str] | None = None, *, color: bool | None = None,
                 show: frozenset[str] | None = None, quiet: bool = False,
                 tf_noise: bool = False, live: bool | None = None,
                 lead: str | None = None) -> None:
        self.stream = stream or sys.stdout
        tty = self.stream.isatty()
        self.color = tty if color is None else color
        self.live = tty if live is None else live
        self.show = show
        self.quiet = quiet
        self.tf_noise = tf_noise
        self.lead = lead
        self._lock = threading.Lock()
        self._progress: dict[str, str] = {}   # task -> its newest rendered update
        self._status: str | None = None       # the supervisor's status line (live only)
        self._drawn = 0                       # lines of the region on screen (cursor on its last)

    def visible(self, task: str) -> bool:
        if self.quiet:
            return False
        if self.show is None:
            return True
        return task in self.show or task.split(":")[0] in self.show

    def _follows_lead(self, task: str) -> bool:
        # Only the synchronous trainers print the same progress; an evaluator's is its own.
        return self.lead is None or task == self.lead or \
            task.split(":")[0] not in ("chief", "worker")

    def _prefix(self, task: str, color_index: int) -> str:
        prefix = f"[{task}]"
        if self.color:
            prefix = f"\x1b[{_COLORS[color_index % len(_COLORS)]}m{prefix}\x1b[0m"
        return prefix

    def task_line(self, task: str, color_index: int, line: str, noise: bool | None = None) -> None:
        """Show one line of ``task`` (``noise``: the caller's stateful verdict, if any)."""
        if noise is None:
            noise = is_tf_noise(line)
        with self._lock:
            self._progress.pop(task, None)  # the line ends (or replaces) the task's bar
        if not self.visible(task) or (noise and not self.tf_noise):
            return
        if not self._follows_lead(task) and is_keras_progress(line):
            return
        if not self.color:
            line = strip_ansi(line)
        self.write(f"{self._prefix(task, color_index)} {line}")

    def task_progress(self, task: str, color_index: int, text: str) -> None:
        """Redraw ``task``'s live progress line (terminals only)."""
        if not self.live or not self.visible(task) or not self._follows_lead(task):
            return
        if not self.color:
            text = strip_ansi(text)
        rendered = f"{self._prefix(task, color_index)} {text}"
        with self._lock:
            self._progress.pop(task, None)
            self._progress[task] = rendered  # newest last: the one drawn
            self._redraw()

    def set_status(self, text: str | None) -> None:
        """The status line at the bottom of a live terminal (None removes it)."""
        if not self.live:
            return
        with self._lock:
            if text == self._status:
                return
            self._status = text
            self._redraw()

    def _region(self) -> list[str]:
        lines = []
        if self._progress:
            lines.append(next(reversed(self._progress.values())))
        if self._status:
            lines.append(("\x1b[2m" + self._status + "\x1b[0m") if self.color else self._status)
        width = shutil.get_terminal_size((120, 24)).columns - 1
        # A wrapped line could not be erased: cut each to the terminal's width.
        return [strip_ansi(l)[:width] if len(strip_ansi(l)) > width else l for l in lines]

    def _erase(self) -> None:
        if self._drawn:
            self.stream.write("\r\x1b[K" + "\x1b[1A\r\x1b[K" * (self._drawn - 1))
        self._drawn = 0

    def _redraw(self) -> None:
        try:
            self._erase()
            region = self._region()
            if region:
                self.stream.write("\r\x1b[K" + "\n".join(region))
                self._drawn = len(region)
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def info(self, text: str) -> None:
        """A tfrun message (always shown)."""
        prefix = "\x1b[1mtfrun:\x1b[0m" if self.color else "tfrun:"
        for line in text.splitlines() or [""]:
            self.write(f"{prefix} {line}")

    def write(self, text: str) -> None:
        with self._lock:
            try:
                if self._drawn:  # the line goes above the region, which is redrawn
                    self._erase()
                self.stream.write(text.rstrip("\n") + "\n")
                self.stream.flush()
            except (OSError, ValueError):  # closed, broken pipe, disk full: keep going
                pass
            if self._progress or self._status:
                self._redraw()

    def end_progress(self) -> None:
        """Forget every progress line and the status line (the run is over: the summary
        follows)."""
        with self._lock:
            self._progress.clear()
            self._status = None
            self._redraw()


_DEVICES_REPLACED = re.compile(re.escape(DEVICES_REPLACED) + r"(\d+) logical CPU")


def replaced_device_count(line: str) -> int | None:
    """The logical CPU count in a task's "the script configures N ..." warning, else None.

    >>> replaced_device_count("x.py:3: UserWarning: tfrun: the script configures 3 logical "
    ...                       "CPU device(s) itself, replacing tfrun --devices 2: ...")
    3
    """
    match = _DEVICES_REPLACED.search(line)
    return int(match.group(1)) if match else None


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
    #: logical CPUs the task really runs with, when its script replaced ``tfrun --devices``
    #: (read from the task's warning; None when it did not)
    devices_in_use: int | None = None
    #: the supervisor's "a peer exited 0 and none failed" (see NoiseFilter)
    peers_left_cleanly: Callable[[], bool] | None = None
    #: where the task's ``tfrun:metrics`` records go (JSON lines; None: nowhere)
    metrics_path: Path | None = None
    #: the newest epoch record of the task (the live status line reads it)
    last_epoch: dict | None = None
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
        noise = NoiseFilter(self.peers_left_cleanly)
        splitter = OutputSplitter()
        log = self._open_log()
        try:
            for chunk in read_chunks(stream):
                if log is not None:
                    try:
                        log.write(chunk)
                    except OSError as exc:
                        self._failed(exc)
                        _close_quietly(log)
                        log = None
                self._show(splitter.feed(chunk), noise)
            self._show(splitter.close(), noise)
        finally:
            _close_quietly(log)
            stream.close()

    def _show(self, events: list[tuple[str, str]], noise: NoiseFilter) -> None:
        for kind, text in events:
            if kind == "metrics":
                # A resource sample comes from a daemon thread every few seconds, whatever
                # the main thread does: it is no sign of progress for the hang watchdog.
                if self._record_metrics(text) != "resources":
                    self.last_line_at = time.monotonic()
                continue
            self.last_line_at = time.monotonic()
            if kind == "progress":
                self.console.task_progress(self.task, self.color_index, text)
                continue
            with self._recent_lock:
                self._recent.append(text)
                self.lines_read += 1
            if DEVICES_REPLACED in text:
                self.devices_in_use = replaced_device_count(text) or self.devices_in_use
            self.console.task_line(self.task, self.color_index, text, noise=noise(text))

    def _record_metrics(self, raw: str) -> str | None:
        """Append one ``tfrun:metrics`` record (JSON) to the task's metrics file; its event."""
        try:
            record = json.loads(raw)
        except ValueError:
            return None  # cut short (the task died mid-write): nothing to keep
        if not isinstance(record, dict):
            return None
        record = {"task": self.task, **record}
        if record.get("event") == "epoch":
            self.last_epoch = record
        if self.metrics_path is not None:
            try:
                self.metrics_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.metrics_path, "a", encoding="utf-8") as out:
                    out.write(json.dumps(record) + "\n")
            except OSError as exc:
                self._failed(exc)
        return record.get("event")

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
    """The last Python traceback in ``lines``, with its whole exception message, or None.

    TensorFlow's errors carry their explanation *after* the exception line ("End of
    sequence", ``[[{{node IteratorGetNext}}]]``, "N root error(s) found"): the message
    runs until the first TensorFlow log line (or the end). Its "Detected at node ...
    defined at" frame lists, which repeat the traceback, are cut to their last frame.
    Over ``max_lines``, frames are dropped from the middle, never the message.

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
        if any(l.startswith(_CHAIN_MARKERS) for l in gap):
            start = earlier
        else:
            break
    out: list[str] = []
    in_message = False  # past the last frame: the exception line and what explains it
    for line in lines[start:]:
        if _ABSL_LINE.match(line) or is_tf_noise(line):
            if in_message:
                break
            continue  # a log line interleaved with the frames
        if line.startswith("Traceback (most recent call last)") or line.startswith(_CHAIN_MARKERS):
            in_message = False
        elif line.strip() and not line.startswith((" ", "\t")):
            in_message = True
        out.append(line)
    out = _shorten_detected_at(out)
    while out and not out[-1].strip():
        out.pop()
    if len(out) > max_lines:
        head = 6
        out = out[:head] + ["  ... (frames left out; see the log file)"] + out[-(max_lines - head - 1):]
    return "\n".join(out)


_CHAIN_MARKERS = ("During handling of the above exception",
                  "The above exception was the direct cause")


def _shorten_detected_at(lines: list[str]) -> list[str]:
    """TensorFlow's "Detected at node X defined at (most recent call last):" blocks list
    every frame again, with blank lines between them: keep the header and the last frame."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if line.startswith("Detected at node") and line.rstrip().endswith("(most recent call last):"):
            frames = []
            while i < len(lines) and (not lines[i].strip() or lines[i].startswith("  File ")):
                if lines[i].strip():
                    frames.append(lines[i])
                i += 1
            out.extend(frames[-1:])
    return out
