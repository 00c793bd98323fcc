"""Goodput: where every second of a run went, across its attempts and launches.

Each attempt in summary.json carries what its tasks' phase clocks measured (``clock``: the
seconds the reference task -- the chief, else worker:0 -- spent in each phase, from
``tfrun.in_task.measure.progress``), the newest step it reached and the step the next
attempt resumed at. ``ledger(attempts)`` splits the wall time of every attempt, and the
downtime between them, into named parts that add up to it:

* ``start-up``: tfrun preparing the launch and starting the task, the interpreter,
  imports, building the model;
* ``cluster formation``: inside ``tfrun.strategy()`` (the servers and the first collective);
* ``tracing``: each fit's first step (Keras traces, XLA compiles);
* ``steps kept``: training steps whose result the run kept -- the goodput;
* ``steps redone``: steps trained again after a failure (their count times the attempt's
  mean step time), as lost as if never run;
* ``callbacks``: between steps (Keras' bookkeeping, the script's callbacks);
* ``backups``: the part of each backup the training thread waited for;
* ``restore``: a resume's agreement, loading or receiving the state;
* ``evaluation``, ``after training`` (the script's own end);
* ``stop and exit``: from the reference task's last sample to the attempt's end (a
  failure's detection, stopping the others, exits), and tfrun's own end of a launch;
* ``restart downtime``: between an attempt's end and the next one's start;
* ``unaccounted``: the rest (clocks of two processes, rounding; small -- a test checks).

Goodput is ``steps kept`` over the wall time; the time between two launches of the same
command is not the run's (nothing ran) and is reported apart.

    >>> attempt = {"started_at": 0.0, "ended_at": 100.0, "ended": "success",
    ...            "clock": {"began_at": 4.0, "sampled_at": 99.0, "steps": 100,
    ...                      "phases": {"setup": 6.0, "a training step": 80.0,
    ...                                 "callbacks": 9.0}}}
    >>> book = ledger([attempt])
    >>> book["goodput"], book["parts"]["start-up"], book["parts"]["stop and exit"]
    (0.8, 10.0, 1.0)
    >>> headline(book)
    'goodput 80%: 10% start-up, 9% callbacks'
"""

from __future__ import annotations

from ... import contract

__all__ = ["PARTS", "headline", "kept_so_far", "ledger", "mark_launch"]

#: The ledger's parts, in the order a table shows them.
PARTS = ("steps kept", "start-up", "cluster formation", "tracing", "steps redone",
         "callbacks", "backups", "restore", "evaluation", "after training", "stop and exit",
         "restart downtime", "unaccounted")

#: Which part each phase of a task's clock is (phases not named here: ``callbacks`` when
#: they are tfrun's own short ones, else the script's own time, ``after training``).
_PHASE_PART = {
    contract.PHASE_SETUP: "start-up",
    contract.PHASE_FORMING: "cluster formation",
    contract.PHASE_FIRST_STEP: "tracing",
    contract.PHASE_IN_STEP: "steps",
    contract.PHASE_BETWEEN_STEPS: "callbacks",
    contract.PHASE_AGREEMENT: "callbacks",
    contract.PHASE_EVALUATION: "evaluation",
    contract.PHASE_AFTER_TRAINING: "after training",
    "the backup": "backups",
    "the resume": "restore",
    "loading the backup": "restore",
    "the agreement on a backup": "restore",
    "receiving the backup from a peer": "restore",
}


def _attempt_parts(attempt: dict) -> tuple[dict[str, float], float]:
    """One attempt's parts (seconds) and its wall time."""
    started, ended = float(attempt["started_at"]), float(attempt["ended_at"])
    # tfrun's own time before a launch's first attempt (planning, ports, the run dir) and
    # after its last (the summary), in the first and last attempt of each launch
    ended = max(started, ended)
    first = min(started, float(attempt.get("launch_started_at", started)))
    last = max(ended, float(attempt.get("launch_ended_at", ended)))
    wall = last - first
    parts = dict.fromkeys(PARTS, 0.0)
    clock = attempt.get("clock")
    if not clock:  # no sample arrived (a task that died at start): all of it start-up
        parts["start-up"] = ended - first
        parts["stop and exit"] = last - ended
        return parts, wall
    began, sampled = float(clock["began_at"]), float(clock["sampled_at"])
    # The task's clock may run past the launcher's marks: a task forked from a process
    # started earlier begins just before the attempt's mark, and an interrupted run's tasks
    # back up after the attempt was marked ended. Within the launch that time is the
    # clock's (its phases say what it was), not tfrun's own as well: counted once.
    start = max(first, min(started, began))
    end = min(last, max(ended, sampled))
    phases = {phase: float(seconds) for phase, seconds in clock.get("phases", {}).items()}
    before = max(0.0, start - began)  # still outside: the clock began in its start-up
    if before and contract.PHASE_SETUP in phases:
        phases[contract.PHASE_SETUP] = max(0.0, phases[contract.PHASE_SETUP] - before)
    parts["start-up"] += max(0.0, began - start) + (start - first)
    parts["stop and exit"] += max(0.0, end - sampled) + (last - end)
    steps_seconds = 0.0
    for phase, seconds in phases.items():
        part = _PHASE_PART.get(phase, "after training")
        if part == "steps":
            steps_seconds += seconds
        else:
            parts[part] += seconds
    redone = int(attempt.get("steps_redone") or 0)
    steps = int(clock.get("steps") or 0)
    redone_seconds = min(steps_seconds, steps_seconds * redone / steps) if steps else 0.0
    parts["steps redone"] = redone_seconds
    parts["steps kept"] = steps_seconds - redone_seconds
    parts["unaccounted"] = wall - sum(parts.values())
    return parts, wall


def ledger(attempts: list[dict]) -> dict:
    """The run's ledger over ``attempts`` (summary.json's, earlier launches' included):
    ``parts`` (seconds per part, ``PARTS`` order), ``wall`` (their sum: every attempt and
    the downtime between attempts of one launch), ``inside_steps`` (``exchange``: seconds
    of the steps spent in tfrun's exchange, None when it did not run), ``goodput`` (steps kept / wall, None
    without time), ``steps_redone``, ``between_launches`` (seconds between launches, not
    in ``wall``), ``launches`` and ``per_attempt`` (each attempt's parts and wall)."""
    total = dict.fromkeys(PARTS, 0.0)
    per_attempt, between_launches, launches = [], 0.0, 1 if attempts else 0
    previous = None
    for attempt in attempts:
        if not isinstance(attempt.get("started_at"), (int, float)) or \
                not isinstance(attempt.get("ended_at"), (int, float)):
            continue
        parts, wall = _attempt_parts(attempt)
        gap = 0.0 if previous is None else max(0.0, attempt["started_at"] - previous["ended_at"])
        new_launch = previous is not None and bool(
            attempt.get("launch_began")
            or (previous.get("earlier_launch") and not attempt.get("earlier_launch")))
        if new_launch:
            between_launches += gap
            launches += 1
        else:
            parts["restart downtime"] += gap
            wall += gap
        for part, seconds in parts.items():
            total[part] += seconds
        per_attempt.append({"attempt": attempt.get("attempt"),
                            "parts": {p: round(s, 3) for p, s in parts.items()},
                            "wall": round(wall, 3), "new_launch": new_launch})
        previous = attempt
    wall = sum(total.values())
    # inside the steps: the time in tfrun's exchange (its collectives; None when TensorFlow's
    # own all-reduce ran, which tfrun does not clock)
    exchange = [(a.get("clock") or {}).get("exchange_seconds") for a in attempts]
    exchange = [float(x) for x in exchange if isinstance(x, (int, float))]
    return {"parts": {p: round(s, 3) for p, s in total.items()}, "wall": round(wall, 3),
            "inside_steps": {"exchange": round(sum(exchange), 3) if exchange else None},
            "goodput": round(total["steps kept"] / wall, 4) if wall > 0 else None,
            "steps_redone": sum(int(a.get("steps_redone") or 0) for a in attempts),
            "between_launches": round(between_launches, 3), "launches": launches,
            "per_attempt": per_attempt}


def kept_so_far(attempts: list[dict]) -> float:
    """Seconds of kept steps in this launch's ended attempts (the live status line adds the
    running attempt's own)."""
    ours = [a for a in attempts if not a.get("earlier_launch")]
    return ledger(ours)["parts"]["steps kept"] if ours else 0.0


def mark_launch(attempts: list[dict], started: float, ended: float) -> None:
    """Note this launch's start and end (tfrun's own time) in its first and last attempt:
    a resumed launch's ledger keeps the earlier launches' whole."""
    ours = [a for a in attempts if not a.get("earlier_launch")]
    if ours:
        ours[0].setdefault("launch_started_at", started)
        ours[-1]["launch_ended_at"] = ended


def headline(book: dict, attempts: list[dict] | None = None) -> str | None:
    """The console's line: goodput and the two largest other parts, a redone part named by
    the failure that caused it. None without a ledger."""
    if book.get("goodput") is None:
        return None
    wall = book["wall"]
    causes = sorted(((s, p) for p, s in book["parts"].items()
                     if p != "steps kept" and s > 0), reverse=True)[:2]

    def named(part: str) -> str:
        if part == "steps redone" and attempts:
            lost = [a.get("task") for a in attempts if a.get("steps_redone")]
            if lost and lost[0]:
                return f"{book['steps_redone']} steps redone after {lost[0]} failed"
        return part

    said = ", ".join(f"{seconds / wall:.0%} {named(part)}" for seconds, part in causes)
    return f"goodput {book['goodput']:.0%}" + (f": {said}" if said else "")
