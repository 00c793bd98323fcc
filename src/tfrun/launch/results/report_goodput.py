"""The report's ledger: where the time went, per attempt and per run (summary.json's
``goodput``, see ``goodput``): a stacked bar per attempt (or per run, side by side) and a
table of the parts, their seconds and share of the wall time.

    >>> book = {"goodput": 0.5, "wall": 10.0, "steps_redone": 0, "between_launches": 0.0,
    ...         "launches": 1, "parts": {"steps kept": 5.0, "start-up": 5.0},
    ...         "per_attempt": [{"attempt": 1, "parts": {"steps kept": 5.0, "start-up": 5.0},
    ...                          "wall": 10.0, "new_launch": False}]}
    >>> "goodput 50%" in ledger_table(book)
    True
"""

from __future__ import annotations

import html

from .goodput import PARTS, headline
from .plotting import pyplot

__all__ = ["attempt_bars", "ledger_figure", "ledger_table"]

#: one colour per part, the same in every chart (kept steps green, losses warm)
_COLOURS = dict(zip(PARTS, ("#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#d62728",
                            "#7f7f7f", "#ff7f0e", "#bcbd22", "#17becf", "#aec7e8",
                            "#ffbb78", "#f7b6d2", "#c7c7c7")))


def ledger_table(book: dict) -> str:
    """The headline and the parts with their seconds and shares, as HTML."""
    said = headline(book) or "no ledger: no attempt ended"
    wall = book.get("wall") or 0.0
    rows = ["<table class='ledger'><tr><th>part</th><th>seconds</th><th>share</th></tr>"]
    for part, seconds in (book.get("parts") or {}).items():
        if seconds:
            share = f"{seconds / wall:.1%}" if wall else "-"
            rows.append(f"<tr><td>{html.escape(part)}</td><td>{seconds:.1f}</td>"
                        f"<td>{share}</td></tr>")
            exchange = (book.get("inside_steps") or {}).get("exchange")
            if part == "steps kept" and exchange:
                rows.append(f"<tr><td>&nbsp;&nbsp;of all steps: in the exchange</td>"
                            f"<td>{exchange:.1f}</td><td>{exchange / wall:.1%}</td></tr>"
                            if wall else "")
    rows.append(f"<tr><th>wall</th><th>{wall:.1f}</th><th>100%</th></tr></table>")
    notes = [f"<p><b>{html.escape(said)}</b>"]
    if book.get("steps_redone"):
        notes.append(f"; {book['steps_redone']} steps redone after failures")
    if book.get("launches", 1) > 1:
        notes.append(f"; {book['launches']} launches of the same command, "
                     f"{book['between_launches']:.0f} s between them (not counted)")
    return "".join(notes) + "</p>" + "\n".join(rows)


def ledger_figure(bars: list[tuple[str, dict]]):
    """A horizontal stacked bar per ``(label, parts)``: the parts' seconds left to right in
    ``PARTS`` order; None when there is nothing to draw."""
    if not bars or not any(any(v > 0 for v in parts.values()) for _, parts in bars):
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 1.6 + 0.4 * len(bars)))
    for row, (_, parts) in enumerate(bars):
        left = 0.0
        for part in PARTS:
            seconds = max(0.0, float(parts.get(part) or 0.0))
            if seconds:
                ax.barh(row, seconds, left=left, color=_COLOURS[part],
                        label=part if part not in ax.get_legend_handles_labels()[1] else None)
                left += seconds
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title("Where the time went")
    # room on the right for the legend, at the left for the labels (no tight_layout: it
    # does not count a legend outside the axes)
    height = fig.get_size_inches()[1]
    fig.subplots_adjust(left=0.14, right=0.8, bottom=0.5 / height + 0.05,
                        top=1 - 0.35 / height)
    return fig


def attempt_bars(book: dict) -> list[tuple[str, dict]]:
    """One bar per attempt, then, for a run of several launches of the same command, one
    per launch (its attempts' parts summed).

    >>> attempt_bars({"per_attempt": [
    ...     {"attempt": 1, "parts": {"steps kept": 2.0}, "new_launch": False},
    ...     {"attempt": 2, "parts": {"steps kept": 3.0}, "new_launch": True}]})
    [('attempt 1', {'steps kept': 2.0}), ('attempt 2', {'steps kept': 3.0}), ('launch 1', {'steps kept': 2.0}), ('launch 2', {'steps kept': 3.0})]
    """
    attempts = book.get("per_attempt") or []
    bars = [(f"attempt {a.get('attempt')}", a.get("parts") or {}) for a in attempts]
    launches: list[dict] = []
    for attempt in attempts:
        if not launches or attempt.get("new_launch"):
            launches.append({})
        for part, seconds in (attempt.get("parts") or {}).items():
            launches[-1][part] = launches[-1].get(part, 0.0) + seconds
    if len(launches) > 1:
        bars += [(f"launch {n}", parts) for n, parts in enumerate(launches, 1)]
    return bars
