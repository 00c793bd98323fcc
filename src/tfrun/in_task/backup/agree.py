"""The position every replica resumes from, and its state for the replicas that lack it.

Each worker keeps its own backups, on whatever disk its host has. Synchronous workers hold
the same state at the same step, so the newest backup *any* replica holds is the state of
the whole cluster at that step. ``choose`` finds it from every replica's newest few
positions (one all-gather); the replicas that hold it load it from disk, and when some do
not (a spare or a returning host with no or older backups, disks not shared) one holder,
the *source*, sends the weights, the optimizer state and the backup's mark to every
replica over the cluster (``broadcast``: an all-reduce in which only the source adds
anything, so each value arrives bit for bit). What arrives is held in host memory and
checked against the checksum of the state the source holds (``receive_state``) before any
variable takes it: a state damaged on its way is refused by every replica alike
(``all_true``). Training never starts from step 0 while a replica holds an intact backup.

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
from .integrity import StateDigest

__all__ = ["Choice", "all_true", "choose", "gather_positions", "broadcast_numbers",
           "receive_state", "state_digest", "digest_number", "number_digest"]


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


def all_true(strategy, flag: bool) -> bool:
    """Whether every replica's ``flag`` is true (one all-gather; the same answer on all)."""
    return all(row == [1] for row in gather_positions(strategy, [int(bool(flag))], 1))


def state_digest(variables) -> str:
    """The checksum of ``variables``' values as this replica holds them: the one their
    backup's ``values.bin`` has (``integrity.StateDigest``)."""
    import numpy as np

    digest = StateDigest()
    for variable in variables:
        digest.add(np.asarray(variable.numpy()))
    return digest.hexdigest()


def digest_number(hexdigest: str) -> int:
    """A 64-bit checksum as a signed int64 (what an all-reduce of int64 carries exactly).

    >>> number_digest(digest_number("ffffffffffffffff"))
    'ffffffffffffffff'
    """
    value = int(hexdigest, 16)
    return value - (1 << 64) if value >= 1 << 63 else value


def number_digest(number: int) -> str:
    """The hex checksum ``digest_number`` made ``number`` of."""
    return f"{number % (1 << 64):016x}"


def receive_state(strategy, source: int, variables) -> tuple[list, str]:
    """The source replica's values of ``variables`` on every replica, as host arrays
    (assigned to nothing yet), and the checksum of what arrived; one variable at a time."""
    import numpy as np

    arrived, digest = [], StateDigest()
    for variable in variables:
        value = np.asarray(_from_source(strategy, source, variable).numpy())
        digest.add(value)
        arrived.append(value)
    return arrived, digest.hexdigest()
