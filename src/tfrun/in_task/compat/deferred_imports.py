"""Keras 3's optional integrations load when the script first uses them, not at ``import keras``.

Why: ``import keras`` also imports its scikit-learn wrappers (``keras.wrappers``, which
import scikit-learn and with it SciPy's statistics) and its plotting helpers
(``keras.visualization``, which import ``matplotlib.pyplot``) whenever those packages are
installed, as they are in most ML environments, and ``keras.saving`` imports IPython for
notebook display. Here that is about 1.6 of the 3.6 CPU seconds ``import keras`` takes,
in every task and at every restart, for functions a training script rarely calls. ``benchmarks/bench_task_start.py`` measures a task's start
with and without this module; docs/benchmarks.md has the numbers.

What, in every task the bootstrap runs (unless ``contract.DEFER_IMPORTS`` is ``0``):
``install()`` puts a finder first on ``sys.meta_path`` that gives the Keras modules of
``DEFERRED`` Python's own ``importlib.util.LazyLoader``. ``import keras`` binds them as
usual; each module's code runs when the script first reads one of its attributes
(``keras.wrappers.SKLearnClassifier``, ``from keras.visualization import
plot_image_gallery``, ``from IPython import display``): the same module, made later.
Nothing else is deferred, a name the installed Keras does not have is left to the normal
import, and tf_keras imports none of them.
A deferred module answers what its import set before its code ran -- ``__file__``,
``__name__``, ``__cached__`` -- without running that code: code that scans every module in
``sys.modules`` for its file (``inspect.getmodule``, and AutoGraph whenever it converts a
function, e.g. the gather a backup's resume does) would otherwise make them all, and
pay the whole deferred import (2.8 CPU seconds here) in the middle of training.
Two differences remain, both of Python's lazy loading: an error in such a module (a
broken scikit-learn install) surfaces at that first use rather than at ``import keras``;
and Python 3.11's lazy loading takes no lock, so two threads that first touch the same
deferred module at the same instant could see it half made (training's own threads
never touch these modules).

    >>> install()                                    # doctest: +SKIP
    >>> import keras, sys                            # doctest: +SKIP
    >>> "sklearn" in sys.modules                     # doctest: +SKIP
    False
    >>> keras.wrappers.SKLearnClassifier.__mro__[1]  # doctest: +SKIP
    <class 'keras.src.wrappers.sklearn_wrapper.SKLBase'>
"""

from __future__ import annotations

import functools
import importlib.util
import os
import sys
import types
from typing import Mapping

from ... import contract
from ..start._post_import import SpecWrapper

__all__ = ["DEFERRED", "install", "wanted"]

#: Modules made on first use: Keras 3's public packages and the private ones behind them
#: (``keras.src`` imports its ``visualization`` package itself), and IPython, which
#: ``keras.saving``'s file editor imports for its notebook display (a third of a second).
DEFERRED = frozenset({"keras.wrappers", "keras.src.wrappers",
                      "keras.visualization", "keras.src.visualization", "IPython"})


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this task defers them (``contract.DEFER_IMPORTS`` other than ``0``)."""
    return environ.get(contract.DEFER_IMPORTS, "1") != "0"


#: What the import machinery sets on a module before its code runs, and a scan of
#: ``sys.modules`` reads. Not ``__path__``: reading it is how Python imports a package
#: before its submodules, which must stay so.
_KNOWN_BEFORE_LOADING = frozenset({"__file__", "__name__", "__cached__"})


@functools.cache
def _answering_before_loading(lazy_class: type) -> type:
    """``lazy_class`` (the class ``LazyLoader`` gives a module until its first attribute
    read), except that reading a name of ``_KNOWN_BEFORE_LOADING`` does not load it."""

    def __getattribute__(self, attr):
        if attr in _KNOWN_BEFORE_LOADING:
            try:
                return types.ModuleType.__getattribute__(self, attr)
            except AttributeError:
                pass  # the module may set it itself: load it, as a first read would
        return lazy_class.__getattribute__(self, attr)

    return type(f"{lazy_class.__name__}AnsweringNames", (lazy_class,),
                {"__getattribute__": __getattribute__})


class _LazyLoader(importlib.util.LazyLoader):
    """Python's ``LazyLoader``, whose modules answer ``_KNOWN_BEFORE_LOADING`` unloaded."""

    def exec_module(self, module):
        super().exec_module(module)
        # Assigning __class__ reads no attribute: the module stays unloaded.
        module.__class__ = _answering_before_loading(type(module))


class _Deferring(SpecWrapper):
    """Gives the loader of each name of ``DEFERRED`` to ``_LazyLoader``."""

    def wants(self, fullname: str) -> bool:
        return fullname in DEFERRED

    def wrap(self, spec):
        spec.loader = _LazyLoader(spec.loader)
        return spec


def install() -> None:
    """Defer ``DEFERRED`` from now on (once per process; a no-op for modules already
    imported)."""
    if not any(isinstance(finder, _Deferring) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Deferring())
