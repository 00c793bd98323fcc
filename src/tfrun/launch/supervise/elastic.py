"""Elastic membership (``--min-nodes``): weigh a host's failure, re-form the cluster
without a lost or excluded host, take back hosts that answer again at a gang restart.

    elastic = Elastic(ctx, reform, stop)
    nodes_left, streak = elastic.weigh(record)   # before the policy decides on an exit
    elastic.reform_without(record)               # the policy said re-form
    elastic.take_back_hosts()                    # at a gang restart
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Protocol

from ...cluster import ClusterPlan, TaskId
from ..engines.base import Backend, TaskSpec
from ..engines.host_answer import HostAnswer
from .context import RunContext
from .policy import FailureClass
from .records import TaskRecord

__all__ = ["Elastic", "Reform"]


class Reform(Protocol):
    """An elastic engine's re-planning (``--min-nodes``; ``run.ElasticPlanner``)."""

    def hosts_after(self, away: frozenset) -> int:
        """How many hosts the cluster would have without the hosts ``away``."""

    def __call__(self, away: frozenset) -> tuple[ClusterPlan, Mapping[TaskId, Backend],
                                                 Callable[[TaskId, int], TaskSpec]]:
        """The plan of the cluster without ``away``, a backend per task, the spec maker."""


class Elastic:
    """Membership changes of one elastic run; ``stop(records)`` stops tasks at once."""

    def __init__(self, ctx: RunContext, reform: Reform,
                 stop: Callable[[list[TaskRecord]], None]) -> None:
        self.ctx, self.reform, self._stop = ctx, reform, stop
        #: hosts lost earlier that answered again when the last host fault was weighed
        self.back: list[str] = []

    def weigh(self, record: TaskRecord) -> tuple[int, int]:
        """Before the policy decides on ``record``'s failed exit: how many hosts a re-form
        would leave, and how many failures in a row its host has had."""
        ctx, streak = self.ctx, 0
        self.back = []
        if record.failure in (FailureClass.INFRASTRUCTURE, FailureClass.NODE_LOST):
            # failures of one host in a row (another host's, or the script's, ends it; a
            # survivor's collateral error does not)
            streak = ctx.ledger.host_failure(record.host)
            # a host lost earlier that answers again may take this one's place (a re-form
            # then keeps its size instead of shrinking, or failing)
            self.back = self.answering_again()
        nodes_left = self.reform.hosts_after(
            frozenset((ctx.members.away - set(self.back)) | {record.host}))
        return nodes_left, streak

    def reform_without(self, record: TaskRecord) -> None:
        """``record``'s host is lost (or excluded): stop every task, re-plan the cluster on
        the hosts left (tasks renumbered, a new TF_CONFIG), and go on with a bumped restart
        count; the tasks resume from their newest common backup."""
        ctx, config = self.ctx, self.ctx.config
        noticed = time.time()
        lost = {r.host for r in ctx.records if r.host is not None
                and r.failure is FailureClass.NODE_LOST}
        excluded = record.failure is not FailureClass.NODE_LOST
        if excluded:  # failed --exclude-after times in a row (infrastructure)
            lost.add(record.host)
            ctx.members.exclude(record.host)
        why = (f"excluded after {config.exclude_after} infrastructure failures in a row"
               if excluded else "lost")
        ended = ctx.end_attempt(record, "reform")
        self._stop(ctx.running())
        ctx.marks.note_ended(ctx.records, ctx.attempts)
        reached = [r.logger.last_step for r in ctx.records if r.logger.last_step is not None]
        ctx.members.depart(r for r in ctx.records if r.host in lost)
        back, self.back = set(self.back), []
        before, joined = self._replan((ctx.members.away - back) | lost)
        returned = [h for h in joined if h in back]
        spares = [h for h in joined if h not in back]
        self._change(noticed, sorted(lost), joined, why, record.note or str(record.failure),
                     before, **({"answered_again": returned} if returned else {}),
                     **({"saved_at_step": ended["preempted_at_step"]}
                        if "preempted_at_step" in ended else {}),
                     **({"step_reached": max(reached)} if reached else {}))
        hosts = sorted({r.host for r in ctx.records if r.host is not None})
        ctx.console.info(
            f"{', '.join(sorted(lost))} {why} ({record.task}: {record.note or record.failure}); "
            f"re-forming the cluster on {', '.join(hosts)}"
            + (f" ({', '.join(spares)} joining from the spares)" if spares else "")
            + (f" ({', '.join(returned)} answered again: lost earlier, back now)"
               if returned else "")
            + f": {len(ctx.records)} tasks (was {len(before)}; --min-nodes {config.min_nodes}); "
            "the tasks resume from the newest backup any of them holds; the global batch "
            + ("stays what it was (per-replica batches grow)" if config.keep_global_batch
               else "is per-replica x the replicas left"))
        ctx.ledger.next_attempt()

    def take_back_hosts(self) -> None:
        """At a gang restart: hosts lost earlier (not excluded) that answer again join the
        cluster, up to the workers it started with."""
        back = self.answering_again()
        if not back:
            return
        before, joined = self._replan(self.ctx.members.away - set(back))
        if not joined:  # back, but the cluster is full (spares took their places)
            return
        self._change(time.time(), [], joined, "back", "answered again", before)
        self.ctx.console.info(f"{', '.join(joined)} answered again: the restart takes "
                              f"{'it' if len(joined) == 1 else 'them'} back: "
                              f"{len(self.ctx.records)} tasks (was {len(before)})")

    def answering_again(self) -> list[str]:
        """The hosts lost earlier (not excluded) that answer again (ssh, srun, Ray); why
        the others did not is in ``members.silent``."""
        backends = self.ctx.distinct_backends()

        def ask(host: str) -> HostAnswer:
            answers = [b.ask_back(host) for b in backends]
            return next((a for a in answers if a.answered),
                        HostAnswer(False, "; ".join(dict.fromkeys(a.why for a in answers))))
        return self.ctx.members.answering(ask)

    def _replan(self, away: set[str]) -> tuple[list[TaskRecord], list[str]]:
        """Run the cluster without the hosts ``away`` from now on (every task has ended);
        returns the records before and the hosts that joined."""
        ctx = self.ctx
        before = ctx.records
        for old in before:
            old.logger.join()  # a task of the same name logs on into the same file
        ctx.members.away = set(away)
        ctx.adopt(*self.reform(frozenset(ctx.members.away)))
        ctx.open_backends()
        joined = sorted({r.host for r in ctx.records if r.host is not None}
                        - {r.host for r in before})
        return before, joined

    def _change(self, when: float, left: list[str], joined: list[str], how: str,
                reason: str, before: list[TaskRecord], **extra) -> dict:
        """Record one change of the cluster's hosts (and its event)."""
        change = self.ctx.members.change(
            when, left, joined, how, reason, [f"{r.task}@{r.host}" for r in before],
            [f"{r.task}@{r.host}" for r in self.ctx.records], restart=self.ctx.restarts + 1,
            **extra)
        self.ctx.event("membership", **change)
        return change
