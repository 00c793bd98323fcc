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
from concurrent.futures import ThreadPoolExecutor

from ...contract import RESUMED_EVENT
from ..engines.host_answer import HostAnswer

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
        #: the hosts asked last that did not answer, each with why (for the messages)
        self.silent: dict[str, str] = {}

    def exclude(self, host: str) -> None:
        """``host`` failed --exclude-after times in a row: never used again."""
        self.excluded.append(host)

    def depart(self, records: Iterable) -> None:
        """The tasks of hosts that left (kept for the summary's ``departed_tasks``)."""
        self.departed.extend(records)

    def answering(self, ask: Callable[[str], HostAnswer]) -> list[str]:
        """The hosts lost earlier (excluded ones never) that answer again, sorted:
        ``ask(host)`` asks one, all at once (each may take seconds: an ssh connect). Those
        that did not answer are kept in ``silent`` with why.

        >>> members = Membership(min_nodes=1, keep_global_batch=False)
        >>> members.away = {"node-2", "node-3", "node-4"}
        >>> members.exclude("node-4")
        >>> members.answering(lambda host: HostAnswer(host != "node-3", "timed out"))
        ['node-2']
        >>> members.silent
        {'node-3': 'timed out'}
        """
        asked = sorted(self.away - set(self.excluded))
        if not asked:
            self.silent = {}
            return []
        with ThreadPoolExecutor(max_workers=min(len(asked), 16),
                                thread_name_prefix="tfrun-ask-back") as pool:
            answers = dict(zip(asked, pool.map(ask, asked)))
        self.silent = {h: a.why for h, a in answers.items() if not a.answered}
        return [h for h, a in answers.items() if a.answered]

    def too_few(self, host: str, hosts_left: int) -> str:
        """Why losing ``host`` ends the run: fewer hosts left than ``--min-nodes``, and
        which hosts lost earlier did not answer when asked back.

        >>> members = Membership(min_nodes=2, keep_global_batch=False)
        >>> members.silent = {"node-2": "ssh: connect to host node-2 port 22: Connection refused"}
        >>> print(members.too_few("node-3", 1))
        node-3 lost: 1 host left, --min-nodes 2: too few to re-form the cluster; lost earlier and not answering: node-2 (ssh: connect to host node-2 port 22: Connection refused)
        """
        line = (f"{host} lost: {hosts_left} host{'' if hosts_left == 1 else 's'} left, "
                f"--min-nodes {self.min_nodes}: too few to re-form the cluster")
        if self.silent:
            line += "; lost earlier and not answering: " + ", ".join(
                f"{h} ({why})" for h, why in sorted(self.silent.items()))
        return line

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
