"""The TaskError record a task's bootstrap sends when its script raises: what it says of
the exception, and that it survives the trip through its JSON line."""

import errno
import json
import os

import pytest

import tfrun
from tfrun.errors import ConfigError
from tfrun.launch.supervise.policy import FailureClass, classify_exit
from tfrun.records import TaskError

PACKAGE = os.path.dirname(tfrun.__file__)


def _raised(code: str, filename: str) -> BaseException:
    try:
        exec(compile(code, filename, "exec"), {"ConfigError": ConfigError, "errno": errno})
    except Exception as exc:  # noqa: BLE001 - the exception is the test's input
        return exc
    raise AssertionError("the code raised nothing")


@pytest.mark.parametrize("code, filename, inside", [
    ("raise ValueError('bad shape')", "/home/me/train.py", False),
    ("raise ValueError('bad shape')", f"{PACKAGE}/in_task/somewhere.py", True),
    # one tfrun raises on purpose for the script's misuse: not tfrun's bug
    ("raise ConfigError('no strategy')", f"{PACKAGE}/in_task/somewhere.py", False),
    # another task's runtime error passing through tfrun's frames
    ("raise RuntimeError('Unable to parse\\nfrom remote target /job:ps/replica:0/task:0')",
     f"{PACKAGE}/in_task/backup/position.py", False),
])
def test_where_it_was_raised_and_whether_inside_tfrun(code, filename, inside):
    error = TaskError.of(_raised(code, filename), now=5.0)
    assert error.where == f"{filename}:1 in <module>"
    assert error.inside_tfrun is inside
    assert TaskError.from_record(json.loads(json.dumps(error.to_record()))) == error


def test_errno_and_the_chain_are_kept_and_classify_the_exit():
    exc = _raised("try:\n    raise OSError(errno.ENOSPC, 'No space')\n"
                  "except OSError as e:\n    raise RuntimeError('saving failed') from e",
                  "/home/me/train.py")
    error = TaskError.of(exc, now=1.0)
    assert (error.type, error.chain, error.errno) == ("RuntimeError", ("OSError",), None)
    assert classify_exit(1, error=error) is FailureClass.SCRIPT_ERROR
    full = TaskError.of(exc.__cause__, now=1.0)
    assert full.disk_full and classify_exit(1, error=full) is FailureClass.DISK_FULL
    oom = TaskError(time=0, type="tensorflow.python.framework.errors_impl.InternalError",
                    message="x", chain=("tensorflow.python.framework.errors_impl."
                                        "ResourceExhaustedError",))
    assert classify_exit(1, error=oom) is FailureClass.OUT_OF_MEMORY


def test_the_record_beats_the_log_s_text():
    """A log whose last traceback reads like tfrun's own frames, and a record that says the
    script raised it: the record decides."""
    tail = ('Traceback (most recent call last):\n'
            '  File "/x/site-packages/tfrun/in_task/compat/keras3.py", line 91, in <lambda>\n'
            'ValueError: no device\n')
    assert classify_exit(1, log_tail=tail) is FailureClass.OWN_ERROR
    script = TaskError(time=0, type="ValueError", message="no device", where="train.py:3")
    assert classify_exit(1, log_tail=tail, error=script) is FailureClass.SCRIPT_ERROR
    # TensorFlow's runtime lines about a lost peer still say infrastructure
    lost = tail + "Task /job:worker/replica:0/task:1 stopped sending heartbeats\n"
    assert classify_exit(1, log_tail=lost, error=script) is FailureClass.INFRASTRUCTURE


@pytest.mark.parametrize("record", [
    {"event": "error"}, {"event": "error", "type": "X", "time": "soon", "message": ""},
    {"event": "resources", "type": "X", "time": 1.0, "message": ""}])
def test_a_malformed_or_other_record_is_no_error(record):
    assert TaskError.from_record(record) is None


def test_the_headline_is_the_first_line_that_says_something():
    error = TaskError(time=0, type="keras.src.x.ValueError", message="\n\nInput 0 is bad\n"
                      "Arguments received by Sampling.call():")
    assert error.line() == "ValueError: Input 0 is bad"
