"""TensorFlow noise a task prints: start-up chatter kept off the console, and the
"a peer crashed" alarm that is false when the peer left cleanly.
"""

from __future__ import annotations

import re
from typing import Callable

__all__ = ['NoiseFilter', 'is_tf_noise']


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


#: faulthandler's dump: a thread's header, then its frames ("  File "x.py", line 3 in f").
_DUMP_HEADER = re.compile(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_DUMP_FRAME = re.compile(r'^  (?:File "|<no Python frame>)')


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
    hides TensorFlow's "a peer crashed" alarm, which a clean exit of a peer sets off;
    ``stacks_asked`` (tfrun asked the task for its stacks) hides the dump it writes.

    >>> f = NoiseFilter(stacks_asked=lambda: True)
    >>> [f(l) for l in ["Current thread 0x7f (most recent call first):",
    ...                 '  File "train.py", line 9 in <module>', "", "Epoch 2/3"]]
    [True, True, True, False]
    >>> NoiseFilter(stacks_asked=lambda: False)("Thread 0x7f (most recent call first):")
    False
    """

    def __init__(self, peers_left_cleanly: Callable[[], bool] | None = None, *,
                 stacks_asked: Callable[[], bool] | None = None) -> None:
        self._in_block = False
        self._in_alarm = False
        self._in_dump = False
        self._peers_left_cleanly = peers_left_cleanly
        self._stacks_asked = stacks_asked

    def __call__(self, line: str) -> bool:
        if self._stacks_asked is not None and self._is_asked_dump(line):
            return True
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

    def _is_asked_dump(self, line: str) -> bool:
        """A line of the stack dump tfrun asked for at a hang (its digest is on the console
        and the dump in the log); a dump nobody asked for (a crash) is shown."""
        if _DUMP_HEADER.match(line):
            self._in_dump = bool(self._stacks_asked())
            return self._in_dump
        if self._in_dump and (not line.strip() or _DUMP_FRAME.match(line)):
            return True
        self._in_dump = False
        return False
