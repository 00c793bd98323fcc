"""Keras compatibility fixes, applied in every task by the bootstrap.

``install()`` registers a post-import hook: the fixes are applied right after the
first ``import keras`` (also via ``tf.keras``), so a script that never imports Keras
pays nothing, and a script runs unchanged whether tfrun launched it or not.

Every fix names the upstream bug it works around, is guarded to the Keras versions it
was tested on (warn and skip on others; ``contract.COMPAT_FORCE=1`` applies anyway), and
can be switched off for a test or a bisect with ``contract.COMPAT_DISABLE=name,...``
(``all`` for every fix). ``applied()`` lists what was applied in this process::

    >>> import tfrun.in_task.compat
    >>> tfrun.in_task.compat.install()          # doctest: +SKIP
    >>> import keras                    # doctest: +SKIP
    >>> tfrun.in_task.compat.applied()          # doctest: +SKIP
    ['mwms_symbolic_build', 'mwms_reduce_logs', ...]
"""

from __future__ import annotations

import os
import warnings

from ... import contract
from ..start._post_import import when_imported
from . import internals

__all__ = ["install", "apply_keras3_fixes", "apply_tf_keras_fixes", "applied", "FIX_NAMES"]

_applied: list[str] = []
_done = False
_tf_keras_done = False


def applied() -> list[str]:
    """Names of the fixes applied in this process, in order."""
    return list(_applied)


def _disabled() -> set[str]:
    return {n.strip() for n in os.environ.get(contract.COMPAT_DISABLE, "").split(",") if n.strip()}


def _apply(module, fixes, version: str) -> list[str]:
    disabled = _disabled()
    force = os.environ.get(contract.COMPAT_FORCE, "") not in ("", "0")
    for fix in fixes:
        if "all" in disabled or fix.name in disabled or fix.name in _applied:
            continue
        if not fix.supports(version) and not force:
            warnings.warn(f"tfrun: {module} compat fix {fix.name!r} was tested on {module} "
                          f"{', '.join(fix.tested)}; found {version}: skipped. Set "
                          f"{contract.COMPAT_FORCE}=1 to apply it anyway.", stacklevel=3)
            continue
        problem = internals.feature_problem(internals.fix_feature(fix.name))
        if problem is not None:  # a Keras that renamed what the fix wraps: go without it
            warnings.warn(f"tfrun: {module} compat fix {fix.name!r}: {problem}", stacklevel=3)
            continue
        fix.apply()
        _applied.append(fix.name)
    return applied()


def apply_keras3_fixes() -> list[str]:
    """Apply every enabled fix to the imported Keras 3 (idempotent). Returns the names applied."""
    global _done
    if _done:
        return applied()
    _done = True
    import keras

    from . import keras3

    version = getattr(keras, "__version__", "0")
    if not version.startswith("3.") or keras.backend.backend() != "tensorflow":
        return applied()
    return _apply("Keras", keras3.FIXES, version)


def apply_tf_keras_fixes() -> list[str]:
    """Apply every enabled fix to the imported tf_keras (idempotent)."""
    global _tf_keras_done
    if _tf_keras_done:
        return applied()
    _tf_keras_done = True
    import tf_keras

    from . import tf_keras as fixes

    return _apply("tf_keras", fixes.FIXES, getattr(tf_keras, "__version__", "0"))


def install() -> None:
    """Apply the fixes now if Keras is imported, else as soon as it is."""
    when_imported("keras", lambda _module: apply_keras3_fixes())
    when_imported("tf_keras", lambda _module: apply_tf_keras_fixes())


def __getattr__(name: str):
    if name == "FIX_NAMES":  # derived from the fix table (keras3 imports nothing heavy)
        from . import keras3, tf_keras

        return tuple(fix.name for fix in keras3.FIXES + tf_keras.FIXES)
    raise AttributeError(name)
