"""Whether one attempt's cluster formed (every task's server answers), and what to say
when it did not within ``--join-timeout``.

    join = JoinWatch(records, backend_of, cluster_size=3, join_timeout=600, say=print,
                     event=event, problems=lambda: [])
    while not join.check():            # says "cluster formed ..." once, when it does
        if join.timed_out():
            task, message = join.failure()  # the first task still waited for, and why
    join.stop()
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ...contract import TF_CONFIG_REPLACED
from ..network.rendezvous import JoinProbe
from .records import TaskRecord
from .summary import log_tail

__all__ = ["JoinWatch"]


class JoinWatch:
    """Probes each task's address from where the task is reachable (its backend: inside a
    private network, over this machine's network otherwise), from this attempt's start."""

    def __init__(self, records: list[TaskRecord], backend_of: Callable, *, cluster_size: int,
                 join_timeout: float, say: Callable[[str], None], event: Callable[..., None],
                 problems: Callable[[], list[str]]) -> None:
        self._records, self._size, self._timeout = records, cluster_size, join_timeout
        self._say, self._event, self._problems = say, event, problems
        self.started = time.monotonic()
        #: a one-task cluster has nothing to join
        self.formed = cluster_size <= 1
        self._probe: JoinProbe | None = None
        if not self.formed:
            backend_of_address = {r.address: backend_of(r) for r in records if r.address}
            self._probe = JoinProbe(
                {r.task: r.address for r in records if r.address is not None},
                probe=lambda address, timeout: backend_of_address[address].probe(address, timeout))

    def check(self) -> bool:
        """Whether the cluster has formed (said, and an event, the first time)."""
        if self.formed or self._probe is None:
            return self.formed
        joined = self._probe.joined()
        for record in self._records:
            if record.task in joined:
                record.joined = True
        if any(r.address is not None and not r.joined for r in self._records):
            return False
        seconds = time.monotonic() - self.started
        self._say(f"cluster formed: all {self._size} servers up after {seconds:.1f}s")
        self._event("joined", seconds=seconds)
        self.formed = True
        return True

    def never_formed(self) -> bool:
        """After every task ended well: whether none was ever seen serving. Then the
        script made no strategy of the cluster (each task trained alone, on all of its
        data, and wrote the same files), which the run's success would hide: said once,
        with the fix, and an event."""
        if self.formed or any(r.joined for r in self._records):
            return False
        self._say(f"warning: the {self._size} tasks ended without forming a cluster (no "
                  "task's TensorFlow server came up): each ran alone, on all of its data. A "
                  "script that never makes a strategy does that: use strategy = "
                  "tfrun.strategy() and build the model in its scope "
                  "(docs/writing-your-script.md)")
        self._event("never_formed", tasks=self._size)
        return True

    def timed_out(self) -> bool:
        return not self.formed and time.monotonic() - self.started > self._timeout

    def failure(self) -> tuple[TaskRecord | None, str]:
        """The first task still waited for, and a message naming every one and why (its
        event written too)."""
        waiting = [r for r in self._records if r.address is not None and not r.joined]
        exited = [r for r in self._records if r.state.done]
        # A script that replaced tfrun's TF_CONFIG built another cluster: say so, not "never
        # started a server" (it may well have, elsewhere).
        replaced = [r for r in waiting if TF_CONFIG_REPLACED in log_tail(r.logger.path)]
        silent = [r for r in waiting if r not in replaced]
        parts = [f"the cluster did not form within --join-timeout {self._timeout:g}s: "]
        if replaced:
            parts.append(f"{', '.join(str(r.task) for r in replaced)} replaced the TF_CONFIG "
                         "tfrun set with its own (the script assigns os.environ['TF_CONFIG']; "
                         "see the warning in its log), so it could not join tfrun's cluster")
        if silent:
            parts.append(("; " if replaced else "") +
                         f"{', '.join(str(r.task) for r in silent)} never started a TensorFlow "
                         f"server on {', '.join(r.address or '' for r in silent)}")
        if exited:
            parts.append("; already exited: " + ", ".join(
                f"{r.task} (code {r.exit_code})" for r in exited))
        parts.extend(f"; {problem}" for problem in self._problems())
        parts.append(". A task that exits early or never creates its strategy/server leaves the "
                     "others waiting; check its log, or raise --join-timeout if start-up is slow")
        self._event("join-timeout", waiting=[str(r.task) for r in waiting])
        return (waiting[0] if waiting else None), "".join(parts)

    def stop(self) -> None:
        if self._probe is not None:
            self._probe.stop()
            self._probe = None
