"""A backup's bytes checked before they reach a variable: every kind of damage named, the
model untouched, and a state sent by a peer checked against the same checksum (a real Keras
model in this process; the disk faults are real files, a real full tmpfs)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from tfrun import contract

MARK = {"epoch": 0, "batch": 2, "step": 2, "input": None, "replicas": 1}


def _trained(keras):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(300)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(np.ones((8, 3), "float32"), np.zeros((8, 300), "float32"), batch_size=4,
              epochs=1, verbose=0)
    return model


def _fresh(keras):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(300)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


@pytest.fixture
def written(tmp_path):
    """A trained Keras 3 model's backup ``step-2`` in ``tmp_path/worker-0``: (store, save,
    model) -- the store's own listing of it."""
    import keras

    from tfrun.in_task.backup.store import BackupStore

    model = _trained(keras)
    store = BackupStore(str(tmp_path / "worker-0"))
    store.write(model, "step-2", MARK)
    assert store.wait()
    (save,) = store.saves()
    return store, save, model


def _flip_every_97th_byte(path):
    data = bytearray(path.read_bytes())
    for i in range(0, len(data), 97):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _damage(kind: str, state) -> None:
    values = state / "values.bin"
    if kind == "bits flipped":
        _flip_every_97th_byte(values)
    elif kind == "truncated":
        with open(values, "r+b") as f:  # the file may be padded to whole blocks
            f.truncate(os.path.getsize(values) // 8)
    elif kind == "a file missing":
        values.unlink()
    elif kind == "the index changed":
        index = json.loads((state / "variables.json").read_text())
        index["variables"][0]["offset"] += 64
        (state / "variables.json").write_text(json.dumps(index))
    elif kind == "a mark without its files":
        shutil.rmtree(state)


@pytest.mark.parametrize("kind, said", [
    ("bits flipped", r"values.bin: checksum [0-9a-f]{16}, [0-9a-f]{16} was written \(its "
                     r"bytes changed on the disk or in a copy\)"),
    ("truncated", r"values.bin: truncated: \d+ bytes, \d+ were written"),
    ("a file missing", r"values.bin: missing"),
    ("the index changed", r"variables.json: checksum"),
    ("a mark without its files", r"variables.json: missing"),
])
def test_damage_is_named_and_no_byte_of_it_reaches_a_variable(written, kind, said):
    import keras

    from tfrun.in_task.backup.store import BackupDamaged

    store, save, _ = written
    _damage(kind, __import__("pathlib").Path(store.directory) / "step-2.state")
    assert [s["name"] for s in store.saves()] == ["step-2"]  # still listed: named at its load
    fresh = _fresh(keras)
    before = [v.numpy() for v in fresh.weights + fresh.optimizer.variables]
    with pytest.raises(BackupDamaged, match=said) as raised:
        store.load(fresh, save)
    assert raised.value.save is save and raised.value.file in ("values.bin", "variables.json")
    for was, now in zip(before, fresh.weights + fresh.optimizer.variables):
        np.testing.assert_array_equal(now.numpy(), was)  # untouched
    # never offered again by this store
    assert store.visible_saves() == []


def test_an_intact_backup_loads_and_its_checksum_is_the_state_a_peer_would_send(written):
    """The checksum a replica computes from variables it holds (what it sends, what a
    receiver checks) equals the one the mark recorded for values.bin: one checksum for the
    file and for the state on the wire."""
    import keras

    from tfrun.in_task.backup import agree, snapshot

    store, save, model = written
    assert set(save["files"]) == {"values.bin", "variables.json"}
    fresh = _fresh(keras)
    store.load(fresh, save)
    for got, want in zip(fresh.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)
    variables = snapshot.state_variables(model)
    assert agree.state_digest(variables) == save["files"]["values.bin"]["xxh3"]
    assert agree.state_digest(snapshot.state_variables(fresh)) == save["files"]["values.bin"]["xxh3"]


def test_a_backup_written_without_checksums_still_loads(written):
    import keras

    store, save, model = written
    mark = os.path.join(store.directory, "step-2.json")
    with open(mark) as f:
        kept = json.load(f)
    del kept["files"]
    with open(mark, "w") as f:
        json.dump(kept, f)
    (save,) = store.saves()
    assert save["files"] is None
    fresh = _fresh(keras)
    store.load(fresh, save)
    np.testing.assert_array_equal(fresh.get_weights()[0], model.get_weights()[0])


def test_a_shared_directory_offers_the_other_workers_copy_of_a_damaged_one(tmp_path):
    """Each copy of one position is listed, this worker's own last (first tried): when its
    own is damaged, the other worker's copy of the same step serves."""
    import keras

    from tfrun.in_task.backup.store import BackupStore

    model = _trained(keras)
    mine, other = (BackupStore(str(tmp_path / f"worker-{i}")) for i in range(2))
    for store in (mine, other):
        store.write(model, "step-2", MARK)
        assert store.wait()
    copies = mine.visible_saves()
    assert [c["directory"] for c in copies] == [other.directory, mine.directory]
    _flip_every_97th_byte(tmp_path / "worker-0" / "step-2.state" / "values.bin")
    from tfrun.in_task.backup.store import BackupDamaged

    with pytest.raises(BackupDamaged):
        mine.load(_fresh(keras), copies[-1])
    assert [c["directory"] for c in mine.visible_saves()] == [other.directory]
    mine.load(_fresh(keras), mine.visible_saves()[0])


def test_a_full_disk_keeps_the_older_backup_says_so_once_and_the_next_one_tries_again(
        small_disk, capsys, monkeypatch):
    """A model whose backup takes ~0.6 of the disk: the first one is written; the second
    is refused (ENOSPC) in the background -- said once, recorded, its temporary removed, the
    first backup still complete and intact; after space is freed the next backup is
    written and the oldest removed only then."""
    import keras

    from tfrun.in_task.backup.store import BackupStore

    monkeypatch.setenv(contract.RUN_DIR, str(small_disk))
    model = keras.Sequential([keras.Input((100,)), keras.layers.Dense(500)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(np.ones((4, 100), "float32"), np.zeros((4, 500), "float32"), verbose=0)
    store = BackupStore(str(small_disk / "worker-0"))  # 50,500 x 3 floats: ~606 KB a backup
    store.write(model, "step-1", {**MARK, "step": 1})
    assert store.wait()
    for step in (2, 3):
        store.write(model, f"step-{step}", {**MARK, "step": step})
    assert store.wait() is False
    out = capsys.readouterr().out
    assert out.count("not written: No space left on device") == 1, out  # once
    assert "the older backups stay (newest: step-1)" in out
    events = [json.loads(line.split(contract.METRICS_LINE)[1]) for line in out.splitlines()
              if line.startswith(contract.METRICS_LINE)]
    assert [(e["event"], e["backup"], e["errno"]) for e in events] == [
        (contract.BACKUP_NOT_WRITTEN_EVENT, f"step-{s}", 28) for s in (2, 3)]
    assert sorted(os.listdir(store.directory)) == ["step-1.json", "step-1.state"]
    assert store.failing  # a preemption's save asked now would say it was not written
    store.write(model, "step-3", {**MARK, "step": 3}, wait=True)  # a preemption's: on this thread
    assert store.wait() and store.failing
    (save,) = store.saves()
    store.load(_fresh_big(keras), save)  # intact
    shutil.rmtree(small_disk / "worker-0" / "step-1.state")  # space freed (and step-1 gone)
    store.write(model, "step-4", {**MARK, "step": 4})
    assert store.wait()
    assert "backups are written again (step-4 is complete, after 3 the disk refused)" \
        in capsys.readouterr().out
    assert not store.failing


def _fresh_big(keras):
    model = keras.Sequential([keras.Input((100,)), keras.layers.Dense(500)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_an_io_error_while_writing_is_said_and_training_goes_on(tmp_path, capsys, monkeypatch):
    """The device answers a write with EIO (simulated: this kernel has no device-mapper
    or fault injection to make a real one): the backup is refused as a full disk's is, its
    temporary removed, the older backup kept."""
    import errno

    import keras

    from tfrun.in_task.backup import snapshot
    from tfrun.in_task.backup.store import BackupStore

    monkeypatch.setenv(contract.RUN_DIR, str(tmp_path))
    model = _trained(keras)
    store = BackupStore(str(tmp_path / "worker-0"))
    store.write(model, "step-1", {**MARK, "step": 1})
    assert store.wait()
    real = snapshot._write_values

    def failing(state, path):
        real(state, path)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(snapshot, "_write_values", failing)
    store.write(model, "step-2", {**MARK, "step": 2})
    assert store.wait() is False
    out = capsys.readouterr().out
    assert "tfrun: backup step-2 not written: Input/output error" in out
    assert sorted(os.listdir(store.directory)) == ["step-1.json", "step-1.state"]


def test_an_io_error_while_reading_a_backup_names_it_damaged(written, monkeypatch):
    """A read the device answers with EIO is damage (ordinary reads: a mapping would end
    the task with SIGBUS instead)."""
    import builtins
    import errno

    import keras

    from tfrun.in_task.backup.store import BackupDamaged

    store, save, _ = written
    real_open = builtins.open

    class Failing:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def readinto(self, view):
            raise OSError(errno.EIO, "Input/output error")

    def open_(path, mode="r", *args, **kwargs):
        f = real_open(path, mode, *args, **kwargs)
        return Failing(f) if str(path).endswith("values.bin") else f

    monkeypatch.setattr(builtins, "open", open_)
    with pytest.raises(BackupDamaged, match=r"values.bin: unreadable: Input/output error"):
        store.load(_fresh(keras), save)
