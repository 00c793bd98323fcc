"""Resuming from the backups, at a fit's start: the backup every replica agrees on, loaded
or received from a peer; where ``fit`` starts; the input put back where it was. The half of
``ConsistentBackup`` (``tfrun.in_task.backup.callback``) that ``on_train_begin`` runs.

    >>> class Callback(Resume):  # what ConsistentBackup is, on a Keras Callback
    ...     pass
    >>> Callback._exact, Callback._legacy  # until consistent_backup_class sets the flavour's
    (False, False)
"""

from __future__ import annotations

import contextlib

from ... import contract
from ..measure.metrics import record_training_event
from ..notes import eager_by_design
from . import agree, store
from .position import ResumePoint, skip_batches

__all__ = ["Resume"]


def _variables(optimizer) -> list:
    """The optimizer's variables (its step, its slots), in either flavour."""
    if optimizer is None:
        return []
    found = optimizer.variables
    return list(found() if callable(found) else found)


class Resume:
    """``ConsistentBackup``'s resume (a mixin). It reads the callback's ``model``,
    ``store``, ``watch``, ``directory``, ``_ps`` (parameter-server training) and ``_input``
    (the input's position), and the flavour's ``_legacy`` (tf_keras) and ``_exact`` (step-
    exact resume available), which ``consistent_backup_class`` sets; it sets ``_epoch`` and
    ``_last_saved_step``."""

    _legacy = False
    _exact = False

    def _resume(self):
        save = self._intact_choice()
        if save is None:
            return
        save = self._where_to_start(save)
        replicas = self.model.distribute_strategy.num_replicas_in_sync
        if save["replicas"] is not None and save["replicas"] != replicas:
            print(f"tfrun: the cluster has {replicas} replicas now, {save['replicas']} when "
                  "this backup was taken (re-formed): training goes on from its step; "
                  "the input's position inside the epoch is approximate (each replica's "
                  "share of the data changed)", flush=True)
        if self._legacy:  # tf_keras' fault-tolerance hook: fit starts at this epoch and step
            self.model._training_state = ResumePoint(save["epoch"], save["batch"])
        else:
            self.model._initial_epoch = save["epoch"]
        self._epoch = save["epoch"]
        self._last_saved_step = self._global_step()
        record_training_event(contract.RESUMED_EVENT, step=self._last_saved_step,
                              epoch=save["epoch"] + 1, batch=save["batch"])
        self._put_input_back(save)

    def _intact_choice(self) -> dict | None:
        """The newest backup position any replica holds intact, loaded on every replica
        (from its own copy or, for those without one, from a peer); its mark. None: none
        is left (start over). Rounds until then, each one the same on every replica: a
        damaged copy is named and dropped by the replica that found it, a state that
        arrived damaged is dropped by all, and the next round chooses again."""
        strategy = self.model.distribute_strategy
        refused: set[int] = set()  # positions whose transfer arrived damaged
        loaded: dict | None = None  # the backup this replica's variables hold now
        while True:
            visible = [s for s in self.store.visible_saves() if s["key"] not in refused]
            keys = sorted({save["key"] for save in visible})
            if self._ps:  # the coordinator alone holds the training state's backups
                holders = [keys]
            else:
                with self.watch.busy("the agreement on a backup", with_peers=True):
                    holders = agree.gather_positions(strategy, keys, store.KEEP + 1)
            choice = agree.choose(holders)
            if choice is None:
                if self.store.damaged or refused:
                    print("tfrun: no intact backup is left on any worker: training starts "
                          "from the beginning", flush=True)
                return None
            self._build_optimizer()
            if loaded is None or loaded["key"] != choice.position:
                loaded = self._load_intact([s for s in visible if s["key"] == choice.position])
            intact = loaded is not None or choice.position not in keys
            if self._ps:
                if not intact:
                    continue
            else:
                with self.watch.busy("the agreement on a backup", with_peers=True):
                    if not agree.all_true(strategy, intact):
                        continue  # a holder's copies were damaged: it offers others now
            if choice.complete(len(holders)):
                return loaded
            got = self._state_from_peers(choice, loaded, keys)
            if got is not None:
                return got
            refused.add(choice.position)
            loaded = None

    def _load_intact(self, copies: list[dict]) -> dict | None:
        """The first of ``copies`` (one position) that loads intact -- the epoch form when
        the point was saved twice, this worker's own first -- or None; each damaged copy
        named (console, events) and never offered again."""
        order = sorted(copies, key=lambda s: (s["name"].startswith("epoch"),
                                              s["directory"] == self.directory), reverse=True)
        for save in order:
            try:
                with self.watch.busy("loading the backup"):
                    self.store.load(self.model, save)
                return save
            except store.BackupDamaged as damage:
                print(f"tfrun: backup damaged, not used: {damage} (step {save['step']}); "
                      "training goes on from an intact copy", flush=True)
                record_training_event(contract.BACKUP_DAMAGED_EVENT, step=save["step"],
                                      backup=f"{save['directory']}/{save['name']}",
                                      file=damage.file, what=damage.what)
        return None

    def _state_from_peers(self, choice, save: dict | None, keys: list[int]) -> dict | None:
        """Some replicas lack the chosen backup (a spare, or a returning host with
        older backups, on a disk of its own): the source replica sends its weights,
        optimizer state and mark to all, and every replica checks what arrived against
        the checksum of the source's state before taking it. Returns the mark as every
        replica has it; None, on every replica, when the state arrived damaged."""
        strategy = self.model.distribute_strategy
        epoch, batch = divmod(choice.position, 2**32)
        where = f"epoch {epoch + 1}, after batch {batch}" if batch else f"the end of epoch {epoch}"
        missing = sorted(set(range(strategy.num_replicas_in_sync)) - set(choice.holders))
        if save is not None and self._replica_holds_source(choice):
            print(f"tfrun: sending the backup of {where} ({save['directory']}/"
                  f"{save['name']}) to the replicas without it ({missing})", flush=True)
        variables = list(self.model.weights) + _variables(self.model.optimizer)
        position = (save or {}).get("input") or (-1, -1)
        held = agree.digest_number(agree.state_digest(variables)) if save is not None else 0
        numbers = [epoch, batch, (save or {}).get("step") or -1, position[0], position[1],
                   (save or {}).get("replicas") or -1, held]
        with self.watch.busy("receiving the backup from a peer", with_peers=True):
            numbers = agree.broadcast_numbers(strategy, choice.source, numbers)
            arrived, digest = agree.receive_state(strategy, choice.source, variables)
            sent = agree.number_digest(numbers[6])
            intact = agree.all_true(strategy, digest == sent)
        if not intact:
            print(f"tfrun: the backup of {where} sent by replica {choice.source} arrived "
                  + ("damaged" if digest != sent else "damaged on another replica")
                  + f" (checksum {digest}, the source holds {sent}): not used; every "
                  "replica goes on from an older backup", flush=True)
            record_training_event(contract.BACKUP_DAMAGED_EVENT, step=numbers[2],
                                  backup=f"replica {choice.source}'s backup (sent)",
                                  file="(over the cluster)",
                                  what=f"checksum {digest}, {sent} was sent")
            return None
        for variable, value in zip(variables, arrived):
            variable.assign(value)
        got = {"epoch": numbers[0], "batch": numbers[1],
               "step": None if numbers[2] < 0 else numbers[2],
               "input": None if numbers[3] < 0 else (numbers[3], numbers[4]),
               "replicas": None if numbers[5] < 0 else numbers[5],
               "key": choice.position, "name": f"replica {choice.source}'s backup",
               "directory": f"replica {choice.source}"}
        if save is None:
            newest = max(keys) if keys else None
            print(f"tfrun: this worker has no backup of {where} (its own newest: "
                  + ("none" if newest is None else
                     "epoch {} batch {}".format(*divmod(newest, 2**32)))
                  + f"): its state came from replica {choice.source} over the cluster "
                  "(checksum verified)", flush=True)
            store.verify(got, self._global_step())
        return save if save is not None else got

    def _replica_holds_source(self, choice) -> bool:
        import tensorflow as tf

        strategy = self.model.distribute_strategy
        with eager_by_design():
            ids = strategy.experimental_local_results(strategy.run(lambda: tf.identity(
                tf.distribute.get_replica_context().replica_id_in_sync_group)))
        return any(int(i) == choice.source for i in ids)

    def _where_to_start(self, save: dict) -> dict:
        """``save`` itself, or for tf_keras a step backup taken after an epoch's last
        step (a preemption checked there) moved to the next epoch's start: its loop,
        started at that step, would run an epoch of no steps and refuse it ("Empty
        logs"). Without exact resume, a step backup starts its epoch again."""
        steps = (self.params or {}).get("steps")
        if self._legacy and save["batch"] and steps and save["batch"] >= steps:
            position = save["input"]
            return {**save, "epoch": save["epoch"] + 1, "batch": 0, "input": (
                None if position is None or self._input is None
                else self._input.after_its_epoch(tuple(position)))}
        if not self._exact and save["batch"]:
            return {**save, "batch": 0, "input": None}
        return save

    def _put_input_back(self, save: dict) -> None:
        where = (f"from the backup of epoch {save['epoch']}" if save["batch"] == 0 else
                 f"at epoch {save['epoch'] + 1}, after its batch {save['batch']} (global "
                 f"step {self._last_saved_step}), from the backup")
        position = save["input"]
        if position is not None and self._input is not None:
            iterator, read = position
            self._input.restore(iterator, read)
            print(f"tfrun: resuming {where} (complete on every worker); the input is put "
                  f"back where it was (iterator {iterator} of the dataset, {read} batches "
                  f"read and skipped): exact when the dataset's order depends only on its "
                  f"seeds (shuffle(seed=...)), not on unseeded randomness", flush=True)
            skip_batches(self.model, 0 if self._legacy else save["batch"], read)
            return
        if save["batch"] == 0:
            whose = "the coordinator's" if self._ps else "complete on every worker"
            print(f"tfrun: resuming {where} ({whose})", flush=True)
            return
        print(f"tfrun: resuming {where} (complete on every worker). Its first "
              f"{save['batch']} batches are read and skipped: exact when the dataset "
              f"gives the same batches every epoch (no shuffle, or "
              f"reshuffle_each_iteration=False)", flush=True)
        skip_batches(self.model, 0 if self._legacy else save["batch"], save["batch"])

    def _build_optimizer(self) -> None:
        """Build the optimizer before loading, so that its state is restored into it
        (inside the strategy's scope: tf_keras makes per-replica optimizer variables
        there only)."""
        optimizer = self.model.optimizer
        if optimizer is not None and not (getattr(optimizer, "built", False)
                                          or getattr(optimizer, "_built", False)):
            with (self.model.distribute_strategy.scope() if self._legacy
                  else contextlib.nullcontext()):
                optimizer.build(self.model.trainable_variables)
