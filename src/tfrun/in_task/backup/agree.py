"""The position every replica resumes from, and its state for the replicas that lack it.

Each worker keeps its own backups, on whatever disk its host has. Synchronous workers hold
the same state at the same step, so the newest backup *any* replica holds is the state of
the whole cluster at that step. ``choose`` finds it from every replica's newest few
positions (one all-gather); the replicas that hold it load it from disk, and when some do
not (a spare or a returning host with no or older backups, disks not shared) one holder,
the *source*, sends the weights, the optimizer state and the backup's mark to every
replica over the cluster (``broadcast``: an all-reduce in which only the source adds
anything, so each value arrives bit for bit). Training never starts from step 0 while a
replica holds a backup.

    >>> choose([[5, 7], [7]])
    Choice(position=7, source=0, holders=(0, 1))
    >>> choose([[3], [], [4, 9]])
    Choice(position=9, source=2, holders=(2,))
    >>> choose([[], []]) is None
    True
"""

from __future__ import annotations

from typing import NamedTuple

from ..notes import eager_by_design

__all__ = ["Choice", "choose", "gather_positions", "broadcast_state", "broadcast_numbers"]


class Choice(NamedTuple):
    position: int          # store.key of the backup every replica resumes from
    source: int            # the replica that sends it to those without it
    holders: tuple         # replicas that hold it on their own disk

    def complete(self, replicas: int) -> bool:
        return len(self.holders) == replicas


def choose(holders: list[list[int]]) -> Choice | None:
    """The newest position any replica holds, its holders and the source (the first
    holder); None when no replica holds a backup (start over)."""
    newest = max((key for row in holders for key in row), default=None)
    if newest is None:
        return None
    having = tuple(r for r, row in enumerate(holders) if newest in row)
    return Choice(newest, having[0], having)


def gather_positions(strategy, keys: list[int], width: int) -> list[list[int]]:
    """Every replica's newest ``width`` positions of ``keys`` (one all-gather)."""
    import numpy as np
    import tensorflow as tf

    padded = np.full(width, -1, dtype=np.int64)
    newest = sorted(set(keys))[-width:]
    padded[:len(newest)] = newest
    # tf.identity: one tensor per replica (MirroredStrategy hands a value every replica
    # returned as the same object back undistributed, and refuses it).
    with eager_by_design():
        gathered = strategy.gather(strategy.run(lambda: tf.identity(padded[None, :])),
                                   axis=0).numpy()
    return [[int(k) for k in row if k >= 0] for row in gathered]


def _from_source(strategy, source: int, value):
    """``value`` as the source replica has it, on every replica: a sum in which every
    other replica adds zeros (exact: x + 0 == x)."""
    import tensorflow as tf

    def contribution():
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        mine = tf.convert_to_tensor(value)  # a variable: this replica's copy
        return tf.where(tf.equal(replica, source), mine, tf.zeros_like(mine))

    with eager_by_design():
        return strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(contribution),
                               axis=None)


def broadcast_numbers(strategy, source: int, numbers: list[int]) -> list[int]:
    """Small integers (a backup's mark) from the source replica to every replica."""
    import numpy as np

    values = np.asarray(numbers, dtype=np.int64)
    return [int(v) for v in _from_source(strategy, source, values).numpy()]


def broadcast_state(strategy, source: int, variables) -> None:
    """Assign every replica's ``variables`` the source replica's values, one variable at a
    time (the peak extra memory is the largest variable, not the model)."""
    for variable in variables:
        variable.assign(_from_source(strategy, source, variable))
