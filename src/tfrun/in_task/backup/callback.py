"""``ConsistentBackup``: the Keras callback that wires the store, the agreement, the input
position and the preemption watch together (see the package docstring for what it does).

    >>> cls = consistent_backup_class(keras)  # doctest: +SKIP
    >>> model.fit(data, callbacks=[cls("backup/worker-0", save_freq=20)])  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import sys

from ... import contract
from ..compat import internals
from ..metrics import note_step, record_training_event
from ..notes import say_once
from ..preemption import PreemptionWatch, stop_preempted
from ..runtime import is_parameter_server_strategy
from . import agree, snapshot, store
from .position import InputPosition, LegacyInputPosition, ResumePoint, skip_batches

__all__ = ["consistent_backup_class"]


def _variables(optimizer) -> list:
    """The optimizer's variables (its step, its slots), in either flavour."""
    if optimizer is None:
        return []
    found = optimizer.variables
    return list(found() if callable(found) else found)

def _say_once(text: str) -> None:
    say_once(text, f"tfrun: {text}", file=sys.stdout)


def consistent_backup_class(keras):
    """``ConsistentBackup`` for this Keras (built lazily: importing Keras is slow)."""

    legacy = keras.__version__.startswith("2.")  # tf_keras
    flavour = "tf_keras" if legacy else "keras"
    input_position = LegacyInputPosition if legacy else InputPosition
    exact = input_position.install()

    class ConsistentBackup(keras.callbacks.Callback):
        """Per-worker backups (every epoch, and every ``save_freq`` steps); resume from the
        newest one every replica completed."""

        def __init__(self, directory: str, *, delete_checkpoint: bool = True,
                     save_freq="epoch", preemption_check="auto") -> None:
            super().__init__()
            self.directory = directory
            self.store = store.BackupStore(directory)
            self.delete_checkpoint = delete_checkpoint
            self.save_freq = save_freq
            self.preemption_check = preemption_check
            self.watch = PreemptionWatch(check_every=preemption_check)
            self._epoch = 0
            self._last_saved_step = -1
            self._input = None  # the training input's position, once fit starts
            #: parameter-server training: only the coordinator runs the callbacks, at
            #: epoch level (tfrun.fit's trainer): no replicas to agree with, no step hooks
            self._ps = False

        # ---------------------------------------------------------------- resume

        def on_train_begin(self, logs=None):
            self._ps = is_parameter_server_strategy(self.model.distribute_strategy)
            self.watch.parameter_server = self._ps
            self._input = None if self._ps or not exact else input_position.of_training()
            if not exact and not self._ps:
                _say_once(internals.exact_resume_problem(flavour) or "")
            elif not self._ps and (note := internals.untested_version(flavour)):
                _say_once(note)
            # A fit that raised in this process may have left a write in flight: on disk
            # first, or its temporary would be taken for a killed task's and removed
            # under the writer (the resume then going back one backup).
            snapshot.finish_writes_in_flight()
            self.store.remove_temporaries()  # of a task killed mid-write; none in flight now
            with self.watch.busy("the resume"):
                self._resume()
            self.watch.start(self._global_step())
            if self.preemption_check:
                self.watch.listen()

        def _resume(self):
            visible = self.store.visible_saves()
            keys = [save["key"] for save in visible]
            if self._ps:  # the coordinator alone holds the training state's backups
                holders = [keys]
            else:
                with self.watch.busy("the agreement on a backup", with_peers=True):
                    holders = agree.gather_positions(self.model.distribute_strategy, keys,
                                                     store.KEEP + 1)
            choice = agree.choose(holders)
            if choice is None:
                return
            self._build_optimizer()
            mine = [save for save in visible if save["key"] == choice.position]
            save = None
            if mine:  # the epoch form when the same point was saved twice; our own first
                save = sorted(mine, key=lambda s: (s["name"].startswith("epoch"),
                                                   s["directory"] == self.directory))[-1]
                with self.watch.busy("loading the backup"):
                    self.store.load(self.model, save)
            if not choice.complete(len(holders)):
                save = self._state_from_peers(choice, save, keys)
            save = self._where_to_start(save)
            replicas = self.model.distribute_strategy.num_replicas_in_sync
            if save["replicas"] is not None and save["replicas"] != replicas:
                print(f"tfrun: the cluster has {replicas} replicas now, {save['replicas']} when "
                      "this backup was taken (re-formed): training goes on from its step; "
                      "the input's position inside the epoch is approximate (each replica's "
                      "share of the data changed)", flush=True)
            if legacy:  # tf_keras' fault-tolerance hook: fit starts at this epoch and step
                self.model._training_state = ResumePoint(save["epoch"], save["batch"])
            else:
                self.model._initial_epoch = save["epoch"]
            self._epoch = save["epoch"]
            self._last_saved_step = self._global_step()
            record_training_event(contract.RESUMED_EVENT, step=self._last_saved_step,
                                  epoch=save["epoch"] + 1, batch=save["batch"])
            self._put_input_back(save)

        def _state_from_peers(self, choice, save: dict | None, keys: list[int]) -> dict:
            """Some replicas lack the chosen backup (a spare, or a returning host with
            older backups, on a disk of its own): the source replica sends its weights,
            optimizer state and mark to all. Returns the mark as every replica has it."""
            strategy = self.model.distribute_strategy
            epoch, batch = divmod(choice.position, 2**32)
            where = f"epoch {epoch + 1}, after batch {batch}" if batch else f"the end of epoch {epoch}"
            if save is not None and self._replica_holds_source(choice):
                print(f"tfrun: sending the backup of {where} ({save['directory']}/"
                      f"{save['name']}) to the replicas without it "
                      f"({sorted(set(range(strategy.num_replicas_in_sync)) - set(choice.holders))}"
                      ")", flush=True)
            position = (save or {}).get("input") or (-1, -1)
            numbers = [epoch, batch, (save or {}).get("step") or -1, position[0], position[1],
                       (save or {}).get("replicas") or -1]
            with self.watch.busy("receiving the backup from a peer", with_peers=True):
                numbers = agree.broadcast_numbers(strategy, choice.source, numbers)
                agree.broadcast_state(strategy, choice.source,
                                      list(self.model.weights) + _variables(self.model.optimizer))
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
                      + f"): its state came from replica {choice.source} over the cluster",
                      flush=True)
                store.verify(got, self._global_step())
            return save if save is not None else got

        def _replica_holds_source(self, choice) -> bool:
            import tensorflow as tf

            strategy = self.model.distribute_strategy
            ids = strategy.experimental_local_results(strategy.run(
                lambda: tf.identity(tf.distribute.get_replica_context().replica_id_in_sync_group)))
            return any(int(i) == choice.source for i in ids)

        def _where_to_start(self, save: dict) -> dict:
            """``save`` itself, or for tf_keras a step backup taken after an epoch's last
            step (a preemption checked there) moved to the next epoch's start: its loop,
            started at that step, would run an epoch of no steps and refuse it ("Empty
            logs"). Without exact resume, a step backup starts its epoch again."""
            steps = (self.params or {}).get("steps")
            if legacy and save["batch"] and steps and save["batch"] >= steps:
                position = save["input"]
                return {**save, "epoch": save["epoch"] + 1, "batch": 0, "input": (
                    None if position is None or self._input is None
                    else self._input.after_its_epoch(tuple(position)))}
            if not exact and save["batch"]:
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
                skip_batches(self.model, 0 if legacy else save["batch"], read)
                return
            if save["batch"] == 0:
                whose = "the coordinator's" if self._ps else "complete on every worker"
                print(f"tfrun: resuming {where} ({whose})", flush=True)
                return
            print(f"tfrun: resuming {where} (complete on every worker). Its first "
                  f"{save['batch']} batches are read and skipped: exact when the dataset "
                  f"gives the same batches every epoch (no shuffle, or "
                  f"reshuffle_each_iteration=False)", flush=True)
            skip_batches(self.model, 0 if legacy else save["batch"], save["batch"])

        def _build_optimizer(self) -> None:
            """Build the optimizer before loading, so that its state is restored into it
            (inside the strategy's scope: tf_keras makes per-replica optimizer variables
            there only)."""
            optimizer = self.model.optimizer
            if optimizer is not None and not (getattr(optimizer, "built", False)
                                              or getattr(optimizer, "_built", False)):
                with (self.model.distribute_strategy.scope() if legacy
                      else contextlib.nullcontext()):
                    optimizer.build(self.model.trainable_variables)

        # ---------------------------------------------------------------- backup

        def on_epoch_begin(self, epoch, logs=None):
            self._epoch = epoch

        def on_train_batch_begin(self, batch, logs=None):
            self.watch.step_began()

        def on_train_batch_end(self, batch, logs=None):
            step = self._global_step()
            self.watch.step_ended(step)
            note_step(step)
            if self.save_freq != "epoch" and \
                    step // self.save_freq > max(self._last_saved_step, 0) // self.save_freq:
                self._save(f"step-{step}", self._epoch, batch + 1)
                self._last_saved_step = step
            if self.watch.due(step) and self.watch.agree(self.model.distribute_strategy, step):
                if self._last_saved_step != step:
                    self._save(f"step-{step}", self._epoch, batch + 1, wait=True)
                with self.watch.busy("the backup"):
                    self.store.wait()  # on disk before the task stops
                stop_preempted("every worker", step,
                               f"epoch {self._epoch + 1}, batch {batch + 1}",
                               epoch=self._epoch + 1, batch=batch + 1)

        def on_test_begin(self, logs=None):
            self.watch.doing = "evaluation"

        def on_test_end(self, logs=None):
            self.watch.doing = "callbacks"

        def on_epoch_end(self, epoch, logs=None):
            done = epoch + 1  # epochs completed: where a resume starts
            self._epoch = done  # also where Keras' hooks reach us without on_epoch_begin
            stopping = self._ps and self.watch.stop_asked
            self._save(f"epoch-{done}", done, 0,
                       self._input.at_epoch_end() if self._input is not None else None,
                       wait=stopping)
            if stopping:
                # Parameter-server training: the coordinator has waited for the epoch's
                # scheduled steps (the next point where the state is whole) and saved it.
                stop_preempted("the coordinator", self._global_step(),
                               f"the end of epoch {done}", epoch=done, batch=0)

        def _implements_train_batch_hooks(self):
            # tf_keras refuses batch-level callbacks under parameter-server training (where
            # this one only works at epoch ends).
            import tensorflow as tf

            return not is_parameter_server_strategy(tf.distribute.get_strategy())

        def on_train_end(self, logs=None):
            with self.watch.busy("the backup"):
                self.store.wait()  # the last backup is on disk when fit returns
            self.watch.close()
            if legacy:
                self.model._training_state = None
            if self.delete_checkpoint:
                for save in self.store.saves():
                    self.store.remove(save["name"])
                self.store.remove_temporaries()

        def _global_step(self) -> int:
            return int(self.model.optimizer.iterations.numpy())

        def _save(self, name: str, epoch: int, batch: int,
                  input_position: tuple[int, int] | None = None, *, wait: bool = False) -> None:
            """Back up now: the state is copied at once, its files written in the
            background (``wait``: before returning)."""
            if input_position is None and self._input is not None:
                input_position = self._input.now()
            mark = {"epoch": epoch, "batch": batch, "step": self._global_step(),
                    "input": input_position,
                    "replicas": self.model.distribute_strategy.num_replicas_in_sync}
            with self.watch.busy("the backup"):
                self.store.write(self.model, name, mark, wait=wait)

    return ConsistentBackup
