"""The live status line under the console's task output:

    tfrun: 2/2 tasks up · epoch 3/15 done · 142.0 steps/s · goodput 61% · 0 restarts · 0:12

    status = StatusLine(console, lambda: records, stragglers=lambda: [], restarts=lambda: 0)
    status.tick()   # on each round of the watch loop; redraws about once a second
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...contract import PHASE_IN_STEP
from .policy import TaskState
from .records import TaskRecord

__all__ = ["StatusLine"]


class StatusLine:
    """Draws the run's state on a live console (nothing when the console is not live)."""

    def __init__(self, console, records: Callable[[], list[TaskRecord]], *,
                 stragglers: Callable[[], list[str]], restarts: Callable[[], int],
                 started: float | None = None,
                 kept_before: Callable[[], float] = lambda: 0.0,
                 attempt_started: Callable[[], float] = lambda: 0.0) -> None:
        """``kept_before``: seconds of kept steps in the launch's ended attempts;
        ``attempt_started``: when the running attempt began (a lead's clock older than it
        is the ended attempt's)."""
        self._console, self._records = console, records
        self._stragglers, self._restarts = stragglers, restarts
        self._kept_before, self._attempt_started = kept_before, attempt_started
        self._started = time.time() if started is None else started
        self._drawn_at = 0.0
        self._drawn_epoch: dict | None = None  # the lead's epoch record last shown

    def text(self) -> str:
        """``tfrun: 2/2 tasks up · epoch 3/15 done · 142.0 steps/s · 0 restarts · 0:12``."""
        records = self._records()
        up = sum(r.state == TaskState.RUNNING for r in records)
        parts = [f"{up}/{len(records)} tasks up"]
        epoch = self._lead_epoch()
        if epoch:
            total = f"/{epoch['epochs']}" if epoch.get("epochs") else ""
            parts.append(f"epoch {epoch.get('epoch')}{total} done")
            rate = epoch.get("steady_steps_per_s") or epoch.get("steps_per_s")
            if rate:
                parts.append(f"{rate:,.1f} steps/s")
        share = self._goodput()
        if share is not None:
            parts.append(f"goodput {share:.0%}")
        named = self._stragglers()
        if named:
            parts.append(f"straggler {', '.join(named)}")
        restarts = self._restarts() + sum(r.task_restarts + r.task_preemptions for r in records)
        parts.append(f"{restarts} restart{'s' if restarts != 1 else ''}")
        elapsed = int(time.time() - self._started)
        parts.append(f"{elapsed // 60}:{elapsed % 60:02d}")
        return "tfrun: " + " · ".join(parts)

    def _goodput(self) -> float | None:
        """Kept steps over the time since the launch began: the ended attempts' and the
        lead task's own steps in the running one (its clock, from its samples); None
        before the lead's first sample."""
        lead = next((r for r in self._records() if str(r.task) == self._console.lead), None)
        clock = lead.logger.clock if lead is not None else None
        kept = self._kept_before()
        if clock is not None and clock["began_at"] >= self._attempt_started() - 1.0:
            kept += clock["phases"].get(PHASE_IN_STEP, 0.0)
        elapsed = time.time() - self._started
        return kept / elapsed if clock is not None and elapsed > 0 else None

    def _lead_epoch(self) -> dict | None:
        """The lead task's last epoch record (None before its first)."""
        lead = next((r for r in self._records() if str(r.task) == self._console.lead), None)
        return lead.logger.last_epoch if lead is not None else None

    def tick(self) -> None:
        """Redraw about once a second, and at once when the lead task reports an epoch (a
        short epoch would otherwise come and go between two redraws)."""
        if not self._console.live:
            return  # (no lookup in the poll loop when nothing is drawn)
        now = time.monotonic()
        epoch = self._lead_epoch()
        if now - self._drawn_at >= 1.0 or epoch is not self._drawn_epoch:
            self._drawn_at, self._drawn_epoch = now, epoch
            self._console.set_status(self.text())
