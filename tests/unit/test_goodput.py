"""The goodput ledger as a pure function of summary.json's attempts (recorded shapes: a
clean attempt, a restart after a lost worker, a stop and the same command again)."""

from __future__ import annotations

import pytest

from tfrun import contract
from tfrun.launch.results.goodput import PARTS, headline, ledger
from tfrun.launch.supervise.attempt_marks import AttemptMarks
from tfrun.launch.supervise.attempts import Attempts


def _attempt(started, ended_at, *, began, sampled, phases, steps, **more):
    return {"started_at": started, "ended_at": ended_at, "ended": more.pop("ended", "success"),
            "clock": {"task": "worker:0", "began_at": began, "sampled_at": sampled,
                      "phases": phases, "steps": steps}, **more}


def test_every_second_of_a_clean_attempt_lands_in_one_part():
    book = ledger([_attempt(100.0, 160.0, began=103.0, sampled=159.0, steps=90, phases={
        contract.PHASE_SETUP: 5.0, contract.PHASE_FORMING: 1.5, contract.PHASE_FIRST_STEP: 2.0,
        contract.PHASE_IN_STEP: 40.0, contract.PHASE_BETWEEN_STEPS: 4.0, "the backup": 1.0,
        contract.PHASE_EVALUATION: 2.0, contract.PHASE_AFTER_TRAINING: 0.5})])
    parts = book["parts"]
    assert list(parts) == list(PARTS)
    assert parts["start-up"] == 8.0 and parts["cluster formation"] == 1.5
    assert parts["tracing"] == 2.0 and parts["steps kept"] == 40.0 and parts["backups"] == 1.0
    assert parts["stop and exit"] == 1.0 and parts["unaccounted"] == 0.0
    assert book["wall"] == 60.0 and sum(parts.values()) == pytest.approx(60.0)
    assert book["goodput"] == pytest.approx(40 / 60, abs=1e-4)
    assert headline(book) == "goodput 67%: 13% start-up, 7% callbacks"


def test_a_restart_charges_the_redone_steps_and_the_downtime_between_attempts():
    """Attempt 1 reached step 47 and worker:1 was lost; attempt 2 resumed at step 27:
    20 steps of attempt 1 were redone (their share of its step time), and the 3 s between
    the attempts are restart downtime."""
    first = _attempt(0.0, 30.0, began=2.0, sampled=27.0, steps=47, ended="restart",
                     task="worker:1", phases={contract.PHASE_SETUP: 1.0,
                                              contract.PHASE_IN_STEP: 23.5,
                                              contract.PHASE_BETWEEN_STEPS: 0.5},
                     reached_step=47, steps_redone=20)
    second = _attempt(33.0, 60.0, began=34.0, sampled=59.0, steps=50, resumed_at_step=27,
                      phases={contract.PHASE_SETUP: 4.0, "loading the backup": 1.0,
                              contract.PHASE_IN_STEP: 20.0})
    book = ledger([first, second])
    assert book["steps_redone"] == 20
    assert book["parts"]["steps redone"] == pytest.approx(23.5 * 20 / 47, abs=1e-3)
    assert book["parts"]["restart downtime"] == 3.0 and book["parts"]["restore"] == 1.0
    assert book["wall"] == 60.0 and book["between_launches"] == 0.0
    assert abs(book["parts"]["unaccounted"]) < 1e-6
    assert headline(book, [first, second]) == \
        "goodput 56%: 17% 20 steps redone after worker:1 failed, 13% start-up"


def test_the_same_command_again_extends_the_ledger_and_the_gap_is_not_the_runs():
    earlier = _attempt(0.0, 20.0, began=1.0, sampled=19.0, steps=40, ended="interrupted",
                       phases={contract.PHASE_SETUP: 3.0, contract.PHASE_IN_STEP: 15.0},
                       earlier_launch=True, launch_began=True, reached_step=42)
    again = _attempt(500.0, 520.0, began=501.0, sampled=519.0, steps=50, launch_began=True,
                     resumed_at_step=42,
                     phases={contract.PHASE_SETUP: 3.0, contract.PHASE_IN_STEP: 15.0})
    book = ledger([earlier, again])
    assert book["launches"] == 2 and book["between_launches"] == 480.0
    assert book["wall"] == 40.0 and book["parts"]["restart downtime"] == 0.0
    assert [a["new_launch"] for a in book["per_attempt"]] == [False, True]


def test_an_attempt_without_a_sample_is_start_up_and_no_ledger_has_no_goodput():
    book = ledger([{"started_at": 0.0, "ended_at": 4.0, "ended": "failed"}])
    assert book["parts"]["start-up"] == 4.0 and book["goodput"] == 0.0
    assert ledger([])["goodput"] is None and headline(ledger([])) is None


def test_the_attempt_after_a_failure_tells_the_one_before_how_many_steps_it_redid():
    marks = AttemptMarks()
    marks.begin([])
    before = {"started_at": 0.0, "reached_step": 47}
    after = {"started_at": 30.0, "resumed_at_step": 40}
    marks.note_training_events([], after, before)
    assert before["steps_redone"] == 7
    again = {"started_at": 0.0, "reached_step": 12}
    marks.note_training_events([], {"started_at": 5.0, "reached_step": 30}, again)
    assert again["steps_redone"] == 12  # no backup: trained again from step 0


def test_a_launch_marks_its_first_attempt_after_the_earlier_launchs():
    ledger_ = Attempts(earlier=[{"attempt": 1, "earlier_launch": True}])
    first = ledger_.end("restart")
    second = ledger_.end("success")
    assert first.get("launch_began") is True and "launch_began" not in second


def test_tfruns_own_time_before_and_after_a_launchs_attempts_is_in_the_ledger():
    """Planning the launch (before its first attempt) is start-up; writing the summary
    (after its last) is its end: the ledger then spans the launch's whole wall time."""
    from tfrun.launch.results.goodput import mark_launch

    attempts = [_attempt(10.0, 40.0, began=11.0, sampled=39.0, steps=10,
                         phases={contract.PHASE_SETUP: 2.0, contract.PHASE_IN_STEP: 26.0})]
    mark_launch(attempts, 9.5, 40.25)
    book = ledger(attempts)
    assert book["wall"] == 30.75 and book["parts"]["start-up"] == 3.5
    assert book["parts"]["stop and exit"] == 1.25 and book["parts"]["unaccounted"] == 0.0


def test_a_clock_that_runs_past_the_attempts_marks_is_counted_once():
    """Recorded shape of an interrupted launch: tfrun marks the attempt ended when the
    signal arrives, then its tasks back up (the clock's last sample 2.7 s later, inside the
    launch's end); a task forked from a warm process began its clock 0.4 s before the
    attempt's mark. Every second lands in one part: nothing is negative, the backup is the
    clock's, and the launch's wall is unchanged."""
    from tfrun.launch.results.goodput import mark_launch

    attempts = [_attempt(10.0, 30.0, began=9.6, sampled=32.7, steps=40, ended="signal",
                         phases={contract.PHASE_SETUP: 3.0, contract.PHASE_IN_STEP: 16.0,
                                 contract.PHASE_BETWEEN_STEPS: 1.0, "the backup": 3.1})]
    mark_launch(attempts, 9.0, 33.0)
    book = ledger(attempts)
    parts = book["parts"]
    assert book["wall"] == 24.0 and sum(parts.values()) == pytest.approx(24.0)
    assert parts["unaccounted"] == pytest.approx(0.0, abs=1e-6), parts
    assert parts["backups"] == 3.1 and parts["steps kept"] == 16.0
    assert parts["start-up"] == pytest.approx(3.6) and parts["stop and exit"] == 0.3
    # a clock that began before the launch's own start: its setup is clipped to the launch
    early = [_attempt(10.0, 30.0, began=8.0, sampled=29.0, steps=40,
                      phases={contract.PHASE_SETUP: 3.0, contract.PHASE_IN_STEP: 18.0})]
    mark_launch(early, 9.0, 30.5)
    book = ledger(early)
    assert book["wall"] == 21.5 and book["parts"]["start-up"] == 2.0
    assert book["parts"]["unaccounted"] == pytest.approx(0.0, abs=1e-6), book["parts"]


def test_the_time_inside_tfruns_exchange_is_told_apart_within_the_steps():
    first = _attempt(0.0, 10.0, began=1.0, sampled=9.0, steps=10,
                     phases={contract.PHASE_IN_STEP: 6.0, contract.PHASE_SETUP: 2.0})
    first["clock"]["exchange_seconds"] = 1.5
    second = _attempt(11.0, 20.0, began=12.0, sampled=19.0, steps=10,
                      phases={contract.PHASE_IN_STEP: 6.0, contract.PHASE_SETUP: 1.0})
    second["clock"]["exchange_seconds"] = 2.0
    assert ledger([first, second])["inside_steps"] == {"exchange": 3.5}
    del first["clock"]["exchange_seconds"], second["clock"]["exchange_seconds"]
    assert ledger([first, second])["inside_steps"] == {"exchange": None}  # TensorFlow's ring


def test_a_preemption_whose_save_the_disk_refused_is_not_called_backed_up():
    """The task says its backup was not written (``saved`` False): the attempt records
    where it stopped apart, and no ``preempted_at_step`` (the launcher's "backed up
    there")."""
    import types

    logger = types.SimpleNamespace(training_events=[], last_step=None, last_epoch=None,
                                   clock=None, join=lambda timeout=None: None)
    record = types.SimpleNamespace(task="worker:0", logger=logger)
    marks = AttemptMarks()
    marks.begin([record])
    logger.training_events.append({"event": contract.PREEMPTED_EVENT, "step": 42,
                                   "saved": False})
    attempt = marks.note_training_events([record], {"started_at": 0.0})
    assert attempt["preempted_without_backup_at_step"] == 42
    assert "preempted_at_step" not in attempt
