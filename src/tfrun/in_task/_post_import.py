"""Run a function right after a module is first imported (internal).

Lets tfrun adjust a library only when the script really uses it, so a script that
never imports it pays nothing::

    >>> when_imported("json.decoder", lambda module: None)  # doctest: +SKIP
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Callable

__all__ = ["when_imported"]


class _PostImport(importlib.abc.MetaPathFinder):
    """Finds ``name`` through the normal finders, then calls its callbacks (in the order they
    were registered) once it has loaded."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self.name = name
        self.callbacks = [callback]
        self._busy = False

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        original = spec.loader.exec_module
        callbacks = self.callbacks

        def exec_module(module):
            original(module)
            for callback in list(callbacks):
                try:
                    callback(module)
                except Exception as exc:  # never break the user's import
                    warnings.warn(f"tfrun: adjusting {fullname} failed: {exc!r}", stacklevel=2)

        spec.loader.exec_module = exec_module  # this loader instance serves only this spec
        return spec


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` now if ``name`` is imported, else right after its import."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    for finder in sys.meta_path:
        if isinstance(finder, _PostImport) and finder.name == name:
            if callback not in finder.callbacks:
                finder.callbacks.append(callback)
            return
    sys.meta_path.insert(0, _PostImport(name, callback))
