"""matplotlib for files only (the Agg backend: never a window, never a display), and
series with gaps where nothing ran.

    >>> pyplot().get_backend().lower()
    'agg'
"""

from __future__ import annotations

__all__ = ["gapped", "pyplot"]


def pyplot():
    """``matplotlib.pyplot``, with the Agg backend selected first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def gapped(points: list[tuple[float, float]], breaks: list[float]) -> list[tuple[float, float]]:
    """``points`` (time, value) with a (break, NaN) between two points on either side of a
    break: matplotlib then draws no line across the time between two launches.

    >>> gapped([(1.0, 5.0), (9.0, 6.0)], [4.0])
    [(1.0, 5.0), (4.0, nan), (9.0, 6.0)]
    """
    out: list[tuple[float, float]] = []
    for point in points:
        if out and any(out[-1][0] < b <= point[0] for b in breaks):
            out.append((next(b for b in breaks if out[-1][0] < b <= point[0]), float("nan")))
        out.append(point)
    return out

    @property
    def tasks(self) -> list[str]:
        return [t["task"] for t in self.summary.get("tasks") or []]
