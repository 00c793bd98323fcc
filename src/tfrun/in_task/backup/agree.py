"""The position every replica resumes from, agreed through one all-reduce.

Each worker keeps its own backups. A worker killed between two workers' backups leaves
them one save point apart, so each gathers every replica's newest few positions and all
take the newest one every replica holds (``common_position``): resuming each from its own
newest would silently mix steps.

    >>> common_position([[5, 7], [7]], "backup")
    7
"""

from __future__ import annotations

__all__ = ["common_position", "gather_positions"]


def common_position(holders: list[list[int]], backup_dir: str) -> int | None:
    """The newest position (``store.key``) every replica has a complete backup of; None
    when a replica has none (the start is then the only point all share: start over).

    >>> common_position([[5, 7], []], "backup") is None
    tfrun: no backup is complete on every worker ([[], [5, 7]]): starting from the beginning
    True

    Raises RuntimeError when every replica has backups but none in common (another run's
    backups in the same directory): guessing would mix two runs.
    """
    if not all(holders):
        if any(holders):  # a worker killed before its first backup was complete
            print(f"tfrun: no backup is complete on every worker ({sorted(map(sorted, holders))}"
                  "): starting from the beginning", flush=True)
        return None
    common = set.intersection(*(set(row) for row in holders))
    if not common:
        raise RuntimeError(f"tfrun.backup_and_restore: the replicas share no backup "
                           f"({[sorted(row) for row in holders]}); remove {backup_dir} to "
                           "start over")
    return max(common)


def gather_positions(strategy, keys: list[int], width: int) -> list[list[int]]:
    """Every replica's newest ``width`` positions of ``keys`` (one all-gather)."""
    import numpy as np
    import tensorflow as tf

    padded = np.full(width, -1, dtype=np.int64)
    newest = sorted(set(keys))[-width:]
    padded[:len(newest)] = newest
    # tf.identity: one tensor per replica (MirroredStrategy hands a value every replica
    # returned as the same object back undistributed, and refuses it).
    gathered = strategy.gather(strategy.run(lambda: tf.identity(padded[None, :])),
                               axis=0).numpy()
    return [[int(k) for k in row if k >= 0] for row in gathered]
