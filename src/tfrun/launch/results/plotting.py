"""matplotlib for files only (the Agg backend: never a window, never a display).

    >>> pyplot().get_backend().lower()
    'agg'
"""

from __future__ import annotations

__all__ = ["pyplot"]


def pyplot():
    """``matplotlib.pyplot``, with the Agg backend selected first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
