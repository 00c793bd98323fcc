"""Issue 71: a damaged backup is never loaded. Real 2-worker MWMS runs of
tests/scripts/step_backup.py (save_freq=10, Adam, a reshuffled dataset): a run stopped
(SIGTERM to tfrun: every worker saves at one step S), bytes of the newest backups damaged
on disk, then the same command again. The damage is named on the console and in
summary.json, training goes on from the newest intact copy (the peer's copy of step S, or
the older backup every worker holds), and the final weights equal an uninterrupted run's.
Last, a real process SIGKILLed in the middle of a 50M-parameter backup's write. Every kind
of damage, a full disk and an I/O error, each on its own: tests/unit/test_backup_integrity.py."""

from __future__ import annotations

import json
import os
import re
import signal
import time

import numpy as np
import pytest

from conftest import ROOT, Run, assert_nothing_left

pytestmark = pytest.mark.tf
SCRIPT = str(ROOT / "tests" / "scripts" / "step_backup.py")


def _steps(path) -> list[tuple[int, int]]:
    """(restart count, global step) per trained batch, from step_backup.py's log."""
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines()]


def _wait_for_step(run, log, step: int) -> None:
    deadline = time.monotonic() + 300
    while max((s for _, s in _steps(log)), default=0) < step:
        assert run.proc.poll() is None, run.proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"worker:0 never reached step {step}"
        time.sleep(0.02)


def _stopped_at(tmp_path, args: list[str], name: str) -> tuple[int, list]:
    """Start ``args``, SIGTERM tfrun after step 42: the step every worker saved at, and the
    steps logged so far."""
    first = Run(tmp_path, args, name=name).start()
    log = tmp_path / f"{name}-steps-worker-0.log"
    _wait_for_step(first, log, 42)
    first.proc.send_signal(signal.SIGTERM)
    assert first.wait(120) == 143, first.stdout[-3000:]
    saved = {int(s) for s in re.findall(r"preempted: every worker saved at step (\d+)",
                                        first.stdout)}
    assert len(saved) == 1, first.stdout[-3000:]
    return saved.pop(), _steps(log)


def _flip_every_97th_byte(path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(0, len(data), 97):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path) -> None:
    """Cut ``values.bin`` to half of the bytes its mark says were written (direct I/O pads
    the file to whole blocks: half the file may be all of them)."""
    stem = path.parent.name[:-len(".state")]
    written = json.loads((path.parent.parent / f"{stem}.json").read_text())["files"]
    with open(path, "r+b") as f:
        f.truncate(written["values.bin"]["bytes"] // 2)


def _same_weights(tmp_path, name: str, reference) -> None:
    want = np.load(reference / "clean-worker-0.npz")
    for i in range(2):
        got = np.load(tmp_path / f"{name}-worker-{i}.npz")
        for k in range(4):
            np.testing.assert_allclose(got[f"arr_{k}"], want[f"arr_{k}"], atol=1e-6, rtol=0)


def _resumed_at(log, before: list) -> int:
    """The first step trained after ``before`` (the steps logged before the relaunch)."""
    return _steps(log)[len(before)][1]


@pytest.mark.parametrize("flavour, damage", [("3", "bits flipped"), ("2", "truncated")],
                         ids=["keras3-bits-flipped", "tf_keras-truncated"])
def test_a_damaged_newest_backup_on_one_worker_comes_from_its_peer(
        tmp_path, step_backup_reference, flavour, damage):
    """Each worker backs up on a disk of its own (--private-backups). After the stop,
    worker:0's newest backup is damaged (every 97th byte flipped, or cut in half): it is
    named and not loaded; worker:1's intact copy of the same step is sent to worker:0 over
    the cluster (checked against its checksum), so nothing is redone."""
    reference = step_backup_reference(flavour)
    args = ["--workers", "2", "--keras", flavour, SCRIPT, str(tmp_path / "stopped"), "3", "10",
            "0.05", "--private-backups"]
    saved, before = _stopped_at(tmp_path, args, "stopped")
    disk = tmp_path / "stopped" / "disk-of-worker-0" / "worker-0"
    values = disk / f"step-{saved}.state" / "values.bin"
    (_flip_every_97th_byte if damage == "bits flipped" else _truncate)(values)

    again = Run(tmp_path, args, name="stopped")
    assert again.run(600) == 0, again.stdout[-3000:]
    said = ("checksum" if damage == "bits flipped" else "truncated")
    assert re.search(rf"worker:0.*tfrun: backup damaged, not used: {re.escape(str(disk))}/"
                     rf"step-{saved}\.state/values\.bin: {said}.*\(step {saved}\)",
                     again.stdout), again.stdout[-3000:]
    logs = [(again.run_dir / "logs" / f"worker-{i}.log").read_text() for i in range(2)]
    assert "its state came from replica 1 over the cluster (checksum verified)" in logs[0], \
        logs[0][-3000:]
    assert "tfrun: sending the backup of" in logs[1]
    assert _resumed_at(tmp_path / "stopped-steps-worker-0.log", before) == saved + 1  # none redone
    (damaged,) = [d for a in again.summary["attempts"] for d in a.get("backups_damaged", [])]
    assert damaged["task"] == "worker:0" and damaged["step"] == saved
    assert damaged["backup"] == f"{disk}/step-{saved}" and damaged["file"] == "values.bin"
    assert "backups: 1 damaged copy found and not used" in again.stdout
    _same_weights(tmp_path, "stopped", reference)
    assert_nothing_left(again)


def test_damaged_newest_backups_on_every_worker_resume_exactly_from_the_older_one(
        tmp_path, step_backup_reference):
    """Both copies of the newest backup damaged (worker:0's bits flipped, worker:1's cut
    in half) in the run's shared backup directory: each worker tries both, names both, and
    every worker goes on from the older backup all of them hold -- at most two save
    intervals redone, never step 0, the weights exact."""
    reference = step_backup_reference("3")
    args = ["--workers", "2", SCRIPT, str(tmp_path / "stopped"), "3", "10", "0.05"]
    saved, before = _stopped_at(tmp_path, args, "stopped")
    backups = tmp_path / "stopped" / "backup"
    _flip_every_97th_byte(backups / "worker-0" / f"step-{saved}.state" / "values.bin")
    _truncate(backups / "worker-1" / f"step-{saved}.state" / "values.bin")

    again = Run(tmp_path, args, name="stopped")
    assert again.run(600) == 0, again.stdout[-3000:]
    resumed = _resumed_at(tmp_path / "stopped-steps-worker-0.log", before)
    older = (saved - 1) // 10 * 10
    assert resumed == older + 1 and 1 <= saved - older <= 20, (saved, resumed)
    damaged = {(d["task"], d["backup"].rsplit("/", 2)[-2], d["file"])
               for a in again.summary["attempts"] for d in a.get("backups_damaged", [])}
    assert damaged == {(task, copy, "values.bin") for task in ("worker:0", "worker:1")
                       for copy in ("worker-0", "worker-1")}, damaged
    for i in range(2):
        log = (again.run_dir / "logs" / f"worker-{i}.log").read_text()
        assert f"resuming at epoch 2, after its batch {older - 30}" in log, log[-3000:]
    _same_weights(tmp_path, "stopped", reference)
    assert_nothing_left(again)


def test_a_state_that_arrives_damaged_from_a_peer_is_refused_and_an_older_one_sent(
        tmp_path, step_backup_reference):
    """worker:1 comes back from a SIGKILL with an empty disk (a spare); worker:0 sends it
    the newest backup, but the first variable arrives changed (the script adds 1 to what
    worker:0 contributes to the broadcast). Every replica refuses it before any variable
    takes it; worker:0 then sends the older backup, which arrives intact: at most two save
    intervals redone, the weights exact, nothing hangs."""
    reference = step_backup_reference("3")
    run = Run(tmp_path, ["--workers", "2", "--max-restarts", "1", SCRIPT,
                         str(tmp_path / "spare"), "3", "10", "0.05", "--private-backups",
                         "--damage-first-send"], name="spare").start()
    log = tmp_path / "spare-steps-worker-0.log"
    _wait_for_step(run, log, 45)
    killed_after = max(s for _, s in _steps(log))
    pid = [e for e in run.events() if e["event"] == "state" and e["task"] == "worker:1"
           and e["new"] == "running"][-1]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert run.wait(600) == 0, run.stdout[-3000:]
    steps = _steps(log)
    trained_before = max(s for r, s in steps if r == 0)
    resumed_at = min(s for r, s in steps if r == 1)
    assert 10 < trained_before - resumed_at + 1 <= 20, (killed_after, trained_before, resumed_at)
    assert (resumed_at - 1) % 10 == 0
    logs = [(run.run_dir / "logs" / f"worker-{i}.log").read_text() for i in range(2)]
    for log_text in logs:
        assert re.search(r"the backup of epoch 2, after batch \d+ sent by replica 0 arrived "
                         r"damaged \(checksum [0-9a-f]{16}, the source holds [0-9a-f]{16}\): "
                         r"not used", log_text), log_text[-3000:]
    assert "its state came from replica 0 over the cluster (checksum verified)" in logs[1]
    damaged = {(d["task"], d["file"]) for a in run.summary["attempts"]
               for d in a.get("backups_damaged", [])}
    assert damaged == {("worker:0", "(over the cluster)"), ("worker:1", "(over the cluster)")}
    _same_weights(tmp_path, "spare", reference)
    assert_nothing_left(run)


@pytest.mark.slow
def test_sigkill_in_the_middle_of_a_50m_parameter_backup_leaves_the_older_one_whole(tmp_path):
    """A real process writing a 604 MB backup (50.3M parameters with Adam) to a disk held
    to 150 MB/s is SIGKILLed while the write is on its way: the half-written backup has no
    mark and is never listed; the older one loads, its checksums verified; the next start
    removes what the cut write left."""
    import subprocess
    import sys

    from throttled_disk import throttled_disk

    script = str(ROOT / "tests" / "scripts" / "backup_write_kill.py")
    with throttled_disk(tmp_path, 4 << 30, 150 << 20) as disk:
        directory = disk / "worker-0"
        writer = subprocess.Popen([sys.executable, script, "write", str(directory)],
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines = []
            while not lines or lines[-1].strip() != "writing":
                line = writer.stdout.readline()
                assert line, "".join(lines)
                lines.append(line)
            assert int(next(l for l in lines if l.startswith("parameters")).split()[1]) \
                >= 50_000_000
            values = directory / "step-2.state.tmp" / "values.bin"
            deadline = time.monotonic() + 60
            while not (values.exists() and values.stat().st_size > 0):
                assert time.monotonic() < deadline, "the second write never started"
                time.sleep(0.01)
            writer.kill()
            writer.wait(30)
            # killed mid-write: less than the backup's 604 MB reached the disk
            assert values.stat().st_size < 600 << 20, values.stat().st_size
        finally:
            writer.kill()
            writer.wait(30)
        assert not (directory / "step-2.json").exists()
        loaded = subprocess.run([sys.executable, script, "load", str(directory)],
                                capture_output=True, text=True, timeout=300)
        assert loaded.returncode == 0, loaded.stdout[-3000:] + loaded.stderr[-3000:]
        assert "complete step-1\n" in loaded.stdout, loaded.stdout
        assert "loaded step-1 weights [0.25]" in loaded.stdout, loaded.stdout
        assert sorted(p.name for p in directory.iterdir()) == ["step-1.json", "step-1.state"]


def test_a_disk_that_fills_during_training_keeps_the_older_backups_and_training_going(
        tmp_path, step_backup_reference, small_disk):
    """The workers back up to a real 1 MiB tmpfs; after their step-20 backups the test fills
    it. Each backup after that is refused by the disk: each worker says so once, trains on,
    and keeps its older backups; worker:1 is then SIGKILLed and the restart resumes from
    step 20 (the newest complete backup), ending with an uninterrupted run's weights; the
    run's end and summary.json count what was not written."""
    reference = step_backup_reference("3")
    disk = small_disk
    run = Run(tmp_path, ["--workers", "2", "--max-restarts", "1", SCRIPT,
                         str(tmp_path / "full"), "3", "10", "0.05",
                         f"--backups-on={disk}"], name="full").start()
    log = tmp_path / "full-steps-worker-0.log"
    _wait_for_step(run, log, 22)
    with open(disk / "filler", "wb", buffering=0) as filler:  # the disk full
        try:
            while True:
                filler.write(b"\0" * 4096)
                filler.flush()
        except OSError:
            pass
    _wait_for_step(run, log, 45)
    pid = [e for e in run.events() if e["event"] == "state" and e["task"] == "worker:1"
           and e["new"] == "running"][-1]["pid"]
    os.kill(pid, signal.SIGKILL)
    assert run.wait(600) == 0, run.stdout[-3000:]
    steps = _steps(log)
    assert min(s for r, s in steps if r == 1) == 21, steps  # from step 20's backup
    for i in range(2):
        text = (run.run_dir / "logs" / f"worker-{i}.log").read_text()
        # said once per process (the first attempt's and the restart's)
        assert text.count("not written: No space left on device") == 2, text[-3000:]
        assert "the older backups stay (newest: step-20)" in text
    refused = [d for a in run.summary["attempts"] for d in a.get("backups_not_written", [])]
    assert {d["task"] for d in refused} == {"worker:0", "worker:1"}
    assert all(d["error"] == "No space left on device" for d in refused)
    assert f"backups: {len(refused)} not written" in run.stdout
    _same_weights(tmp_path, "full", reference)
    assert_nothing_left(run)
