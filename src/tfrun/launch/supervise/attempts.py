"""The run's ledger of attempts: what each restart costs, streaks, and the record of each.

Pure bookkeeping the supervisor asks and tells, no processes: which budget a gang restart
uses (a preemption is free up to ``--max-preemptions``; anything else is charged to
``--max-restarts``), how long to pause before it (a crash loop backs off; an attempt that
trained starts the count again), whether a script error repeats the attempt before's,
and a host's infrastructure failures in a row (``--exclude-after``). Each ended attempt is
one dict in ``records`` (summary.json's ``attempts``); a resumed run's earlier attempts
come first, marked ``earlier_launch``.

    >>> ledger = Attempts(max_restarts=2)
    >>> ledger.charge(FailureClass.PREEMPTED), ledger.charge(FailureClass.SCRIPT_ERROR)
    ('preemptions do not count against --max-restarts', 'restart 1 of 2')
    >>> (ledger.preemptions, ledger.charged)
    (1, 1)
    >>> ledger.pause_before_restart(trained=False), ledger.pause_before_restart(trained=False)
    (0.0, 1.0)
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .policy import FailureClass, backoff_seconds

__all__ = ["Attempts", "earlier_attempts"]


def earlier_attempts(run_dir: Path) -> list[dict]:
    """The attempts of the run this one resumes (its summary.json), marked as earlier."""
    try:
        earlier = json.loads((run_dir / "summary.json").read_text()).get("attempts") or []
    except (OSError, ValueError, AttributeError):
        return []
    return [{**a, "earlier_launch": True} for a in earlier if isinstance(a, dict)]


class Attempts:
    """Budgets used, streaks, and one record per ended attempt."""

    def __init__(self, *, max_restarts: int = 0, earlier: list[dict] | None = None) -> None:
        self.max_restarts = max_restarts
        self.records: list[dict] = list(earlier or [])
        self._launch_began = len(self.records)  # this launch's first attempt: the next one
        self.restarts = 0       # gang restarts and re-forms, all (the tasks see this count)
        self.charged = 0        # those charged to --max-restarts
        self.preemptions = 0    # gang restarts after a preemption (free)
        self.started_at = time.time()
        self._crash_streak = 0  # gang restarts in a row after attempts that trained nothing
        self._last_error: tuple[str, str] | None = None
        self._host_streak: tuple[str | None, int] = (None, 0)

    # ---------------------------------------------------------------- budgets

    def charge(self, failure: FailureClass | None) -> str:
        """Count a gang restart for ``failure``; returns which budget it used, in words."""
        if failure is FailureClass.PREEMPTED:
            self.preemptions += 1
            return "preemptions do not count against --max-restarts"
        self.charged += 1
        return f"restart {self.charged} of {self.max_restarts}"

    def pause_before_restart(self, *, trained: bool) -> float:
        """Seconds to wait before a gang restart: none for the first of a crash loop, then
        1, 2, 4, ... (``backoff_seconds``); an attempt that ``trained`` ends the loop."""
        if trained:
            self._crash_streak = 0
        self._crash_streak += 1
        return backoff_seconds(self._crash_streak)

    def next_attempt(self) -> None:
        """A restart or re-form starts the next attempt."""
        self.restarts += 1
        self.started_at = time.time()

    # ---------------------------------------------------------------- streaks

    def repeated(self, error: tuple[str, str] | None) -> bool:
        """Whether a script error (role, exception line) is the attempt before's."""
        same = error is not None and error == self._last_error
        if error is not None:
            self._last_error = error
        return same

    def host_failure(self, host: str) -> int:
        """One more infrastructure fault of ``host``; its faults in a row, this one included
        (another host's fault starts a new count)."""
        held, count = self._host_streak
        streak = count + 1 if held == host else 1
        self._host_streak = (host, streak)
        return streak

    def end_host_streak(self) -> None:
        """An attempt ended by a task's own failure (not a host's): the count starts over.
        Called once the failure's owner is known, so that a survivor's collateral error
        (its collective failing before the lost host's fault shows) does not end it."""
        self._host_streak = (None, 0)

    # ---------------------------------------------------------------- records

    def end(self, how: str, *, task: str | None = None, exit_code: int | None = None,
            failure: FailureClass | None = None) -> dict:
        """Record the attempt that just ended; returns its record (for more fields)."""
        record = {"attempt": len(self.records) + 1, "started_at": self.started_at,
                  "ended_at": time.time(), "ended": how, "task": task, "exit_code": exit_code,
                  "failure_class": None if failure is None else str(failure)}
        if len(self.records) == self._launch_began:
            record["launch_began"] = True  # the goodput ledger: a gap before it is no downtime
        self.records.append(record)
        return record

    @property
    def current(self) -> dict | None:
        """The newest record (the attempt that ended last), if any."""
        return self.records[-1] if self.records else None
