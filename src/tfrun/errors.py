"""Typed errors for tfrun.

Every error a user can cause says what happened, what was expected, how to fix
it, and what was received, in one paragraph::

    >>> raise ConfigError("Unknown role 'master2'", expected="one of chief, worker, ps, evaluator",
    ...                   fix="Rename the job in the cluster dict", received="'master2'")
    Traceback (most recent call last):
    ...
    tfrun.errors.ConfigError: Unknown role 'master2'. Expected one of chief, worker, ps, evaluator. Fix: Rename the job in the cluster dict. Received: 'master2'

The CLI turns any ``TfrunError`` into that one paragraph on stderr and exit code
``exit_code`` (2 for usage/config errors), never a traceback.
"""

from __future__ import annotations

__all__ = [
    "TfrunError",
    "ConfigError",
    "ClusterTimeout",
    "TaskFailed",
]


_UNSET = object()


class TfrunError(Exception):
    """Base class of every error tfrun raises on purpose.

    Its message is built from ``what`` happened, what was ``expected``, the ``fix`` and
    what was ``received`` (each kept as an attribute); ``exit_code`` is the code the
    ``tfrun`` command exits with when it ends a launch (see [exit codes](exit-codes.md))."""

    exit_code = 1

    def __init__(self, what: str, *, expected: str | None = None, fix: str | None = None,
                 received: object = _UNSET) -> None:
        self.what = what
        self.expected = expected
        self.fix = fix
        self.received = received
        super().__init__(self._format())

    def _format(self) -> str:
        parts = [self.what.rstrip(".") + "."]
        if self.expected:
            parts.append(f"Expected {self.expected.rstrip('.')}.")
        if self.fix:
            parts.append(f"Fix: {self.fix.rstrip('.')}.")
        if self.received is not _UNSET:
            received = self.received if isinstance(self.received, str) else repr(self.received)
            parts.append(f"Received: {received}")
        return " ".join(parts)


class ConfigError(TfrunError):
    """Bad user input: flags, TF_CONFIG, topology, job files. Exit code 2."""

    exit_code = 2


class ClusterTimeout(TfrunError):
    """The cluster did not form (a task exited early or never joined) in time."""

    exit_code = 1


class TaskFailed(TfrunError):
    """A task of the run failed; ``exit_code`` is that task's code (signal n -> 128+n)."""

    def __init__(self, what: str, *, exit_code: int = 1, **kwargs) -> None:
        self.exit_code = exit_code
        super().__init__(what, **kwargs)
