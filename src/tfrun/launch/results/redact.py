"""Keep secrets passed on the command line out of run directories and the console.

Script arguments end up in ``config.json`` and in the launch banner; values that look
like secrets (after ``--token``, ``--password``, ... or in ``NAME=VALUE`` with such a
name) are replaced by ``***`` there. The task itself still gets the real arguments.

    >>> redact_args(["--epochs", "3", "--api-key", "abc", "--token=xyz", "AWS_SECRET=1", "pw"])
    ['--epochs', '3', '--api-key', '***', '--token=***', 'AWS_SECRET=***', 'pw']
"""

from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["redact_args", "looks_secret", "REDACTED"]

REDACTED = "***"
_SECRET_NAME = re.compile(
    r"pass(word|wd|phrase)?|secret|token|api[-_]?key|access[-_]?key|private[-_]?key"
    r"|credential|auth|cookie|session[-_]?key", re.IGNORECASE)


def looks_secret(name: str) -> bool:
    """Whether an option or variable name suggests its value is a secret."""
    return bool(_SECRET_NAME.search(name))


def redact_args(args: Sequence[str]) -> list[str]:
    """``args`` with the values of secret-looking options and variables replaced."""
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, sep, _ = arg.partition("=")
        if sep and looks_secret(name):
            out.append(f"{name}={REDACTED}")
        elif arg.startswith("-") and looks_secret(arg):
            out.append(arg)
            hide_next = True
        else:
            out.append(arg)
    return out
