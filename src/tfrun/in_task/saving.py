"""Chief-aware saving that does the right thing in both Keras flavours.

* Keras 3: only the chief writes ``path``; other workers write nothing (two workers
  writing one ``.weights.h5``/``.keras`` corrupt it).
* tf_keras: *every* worker must call ``save`` (saving reads distributed variables, which
  is a collective operation: a chief saving alone blocks ~20 s, then fails with
  UnavailableError). Non-chief workers save into a private temp directory that is
  deleted right after, the pattern of TensorFlow's multi-worker tutorial.

    >>> tfrun.save(model, tfrun.output_dir("model.keras"))    # doctest: +SKIP
"""

from __future__ import annotations

import os
import shutil
import tempfile

from .runtime import is_chief, task

__all__ = ["save", "is_legacy_keras_model"]


def is_legacy_keras_model(model) -> bool:
    """True for a tf_keras (Keras 2) model, False for Keras 3."""
    return any(cls.__module__.startswith("tf_keras") for cls in type(model).__mro__)


def save(model, path: str, **kwargs) -> str | None:
    """Save ``model`` to ``path`` from the chief; returns ``path`` on the chief, else None.

    Call it on every task of a synchronous cluster (it is a no-op or a throw-away save on
    the others). ``kwargs`` go to ``model.save``.
    """
    if is_chief():
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        model.save(path, **kwargs)
        return path
    if is_legacy_keras_model(model) and task().in_cluster:
        info = task()
        scratch = tempfile.mkdtemp(prefix=f"tfrun-save-{info.role}-{info.index}-")
        try:
            model.save(os.path.join(scratch, os.path.basename(path.rstrip("/")) or "model"), **kwargs)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return None
