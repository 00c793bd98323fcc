"""tfrun's exit codes, and a task's as the shell spells it: read by the engines that start
tasks and by the supervisor that judges them, so they live below both.

    >>> exit_code_of(-9), LOST_EXIT_CODE
    (137, 255)
"""

from __future__ import annotations

__all__ = ["USAGE_ERROR_EXIT_CODE", "LOST_EXIT_CODE", "JOIN_TIMEOUT_EXIT_CODE",
           "HANG_TIMEOUT_EXIT_CODE", "exit_code_of"]

#: Exit code of a usage or configuration error (argparse's, and tfrun's own).
USAGE_ERROR_EXIT_CODE = 2
#: Exit code a backend gives a task whose host, agent or actor was lost (ssh's own 255).
LOST_EXIT_CODE = 255
#: Exit code when the cluster never formed (the same as timeout(1)).
JOIN_TIMEOUT_EXIT_CODE = 124
#: Exit code when a task made no progress for --hang-timeout (timeout(1)'s too).
HANG_TIMEOUT_EXIT_CODE = 124


def exit_code_of(returncode: int) -> int:
    """Shell convention: a negative Popen returncode (signal n) becomes 128+n.

    >>> exit_code_of(-9), exit_code_of(3)
    (137, 3)
    """
    return 128 - returncode if returncode < 0 else returncode
