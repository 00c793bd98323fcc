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

__all__ = ["SpecWrapper", "when_imported"]


class SpecWrapper(importlib.abc.MetaPathFinder):
    """Finds a module it ``wants`` through the other finders, then returns ``wrap(spec)``;
    a module without a loader that can ``exec_module`` is left to the normal import."""

    def __init__(self) -> None:
        self._busy = False

    def wants(self, fullname: str) -> bool:
        raise NotImplementedError

    def wrap(self, spec):
        raise NotImplementedError

    def find_spec(self, fullname, path=None, target=None):
        if self._busy or not self.wants(fullname):
            return None
        self._busy = True  # the lookup below asks every finder, this one included
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        return self.wrap(spec)


class _PostImport(SpecWrapper):
    """Finds ``name`` through the normal finders, then calls its callbacks (in the order they
    were registered) once it has loaded."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        super().__init__()
        self.name = name
        self.callbacks = [callback]

    def wants(self, fullname: str) -> bool:
        return fullname == self.name

    def wrap(self, spec):
        original = spec.loader.exec_module
        callbacks = self.callbacks

        def exec_module(module):
            original(module)
            for callback in list(callbacks):
                try:
                    callback(module)
                except Exception as exc:  # never break the user's import
                    warnings.warn(f"tfrun: adjusting {self.name} failed: {exc!r}", stacklevel=2)

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
