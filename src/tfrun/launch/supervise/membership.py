"""The cluster's hosts over one run: who left (lost or excluded), who joined, and a record
of each change (summary.json's ``membership``, ``departed_tasks``, ``excluded_hosts``).

The supervisor decides and acts (stops the tasks, re-plans, starts them again); this
module only keeps the account and, once the tasks have resumed, completes each change
with where they resumed and how many steps were redone.

    >>> members = Membership(min_nodes=2, keep_global_batch=False)
    >>> change = members.change(100.0, ["node-3"], [], "lost", "no heartbeat",
    ...                         ["worker:0@node-1", "worker:2@node-3"], ["worker:0@node-1"],
    ...                         restart=1)
    >>> members.changes[0]["left"], change["global_batch"]
    (['node-3'], 'per-replica x replicas')
    >>> members.complete([{"event": "resumed", "time": 104.5, "step": 40}])
    ['re-form at restart 1 (lost: node-3): training resumed at step 40, 4.5s after tfrun noticed']
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from ...contract import RESUMED_EVENT

__all__ = ["Membership"]


class Membership:
    """Hosts lost or excluded for the rest of the run, the tasks they ran, and one record
    per change of the cluster's hosts."""

    def __init__(self, *, min_nodes: int | None, keep_global_batch: bool) -> None:
        self.min_nodes = min_nodes
        self.keep_global_batch = keep_global_batch
        self.changes: list[dict] = []  # each re-form: when, who left, the tasks after
        self.departed: list = []  # the TaskRecords of lost hosts' tasks, for the summary
        self.away: set[str] = set()  # lost or excluded: not used again unless they answer
        self.excluded: list[str] = []  # excluded after failures in a row: never again

    def exclude(self, host: str) -> None:
        """``host`` failed --exclude-after times in a row: never used again."""
        self.excluded.append(host)

    def depart(self, records: Iterable) -> None:
        """The tasks of hosts that left (kept for the summary's ``departed_tasks``)."""
        self.departed.extend(records)

    def answering(self, reachable: Callable[[str], bool]) -> list[str]:
        """The hosts lost earlier (excluded ones never) that answer again, sorted:
        ``reachable(host)`` asks one.

        >>> members = Membership(min_nodes=1, keep_global_batch=False)
        >>> members.away = {"node-2", "node-3", "node-4"}
        >>> members.exclude("node-4")
        >>> members.answering(lambda host: host != "node-3")
        ['node-2']
        """
        return sorted(h for h in self.away - set(self.excluded) if reachable(h))

    def change(self, when: float, left: list[str], joined: list[str], how: str, reason: str,
               tasks_before: list[str], tasks_after: list[str], *, restart: int,
               **extra) -> dict:
        """Record one change of the cluster's hosts (``tasks_*``: ``"worker:0@node-1"``)."""
        record = {"time": when, "left": left, "joined": joined, "how": how, "reason": reason,
                  **extra, "tasks_before": tasks_before, "tasks_after": tasks_after,
                  "restart": restart, "min_nodes": self.min_nodes,
                  "global_batch": "kept" if self.keep_global_batch
                  else "per-replica x replicas"}
        self.changes.append(record)
        return record

    def complete(self, training_events: Iterable[dict]) -> list[str]:
        """Each change's ``resumed_at_step`` and ``seconds_to_resume`` (from tfrun noticing
        the loss -- up to --heartbeat-timeout after it -- to the tasks' resume), from the
        first ``resumed`` event after it, and ``steps_redone``: the newest step the tasks
        reported before it (``step_reached``: where the survivors were when stopped, else
        their last sample of a few seconds before; a lower bound) less the step resumed
        at. Returns a console line per change completed now."""
        resumed = [e for e in training_events
                   if e.get("event") == RESUMED_EVENT and isinstance(e.get("time"), float)]
        lines = []
        for change in self.changes:
            if "resumed_at_step" in change:
                continue
            after = [e for e in resumed if e["time"] > change["time"]]
            if not after:
                continue
            first = min(after, key=lambda e: e["time"])
            change["resumed_at_step"] = first.get("step")
            change["seconds_to_resume"] = round(first["time"] - change["time"], 1)
            if isinstance(first.get("step"), int) and "step_reached" in change:
                change["steps_redone"] = max(change["step_reached"] - first["step"], 0)
            lines.append(
                f"re-form at restart {change['restart']} ({change['how']}: "
                f"{', '.join(change['left'] + change['joined'])}): training resumed at step "
                f"{change['resumed_at_step']}, {change['seconds_to_resume']:g}s after tfrun "
                "noticed" + (f"; {change['steps_redone']} steps redone (at least)"
                             if "steps_redone" in change else ""))
        return lines
