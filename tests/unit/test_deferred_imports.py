"""Keras 3's scikit-learn wrappers and plotting helpers load at their first use in a task
(tfrun.in_task.compat.deferred_imports): a real bootstrap run of a script that imports
Keras, then uses them."""

import json
import os
import subprocess
import sys

import pytest

from tfrun.in_task.compat import deferred_imports

PROBE = """
import json, sys
import keras
import probe_functions as PROBE_FUNCTIONS
at_import = {m: m in sys.modules for m in ("sklearn", "matplotlib.pyplot", "scipy.stats")}
at_import["IPython"] = "IPython.core" in sys.modules  # its code ran (not only bound)
used = {}
if sys.argv[1:] == ["scan"]:
    # What scans sys.modules: inspect.getmodule, and AutoGraph converting a function
    # (it looks for the function's file among every module's __file__).
    import inspect, tensorflow as tf
    used["getmodule"] = inspect.getmodule(PROBE_FUNCTIONS.double).__name__
    used["converted"] = float(tf.function(PROBE_FUNCTIONS.double)(tf.constant(2.0)))
    used["wrappers_file"] = sys.modules["keras.wrappers"].__file__.endswith("__init__.py")
    used["made"] = {m: m in sys.modules for m in ("sklearn", "matplotlib.pyplot")}
if sys.argv[1:] == ["use"]:
    from keras.wrappers import SKLearnRegressor
    import sklearn.base
    used["an_estimator"] = issubclass(SKLearnRegressor, sklearn.base.BaseEstimator)
    used["classifier"] = keras.wrappers.SKLearnClassifier.__name__
    from keras.visualization import plot_image_gallery
    used["plotting"] = callable(plot_image_gallery) and "matplotlib.pyplot" in sys.modules
    import keras.src.visualization.plot_image_gallery as direct
    used["one_function"] = direct.plot_image_gallery is plot_image_gallery
    from IPython import get_ipython
    used["no_notebook"] = get_ipython() is None
print("PROBE " + json.dumps({"at_import": at_import, "used": used}), flush=True)
"""


def _probe(tmp_path, *args: str, **env: str) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    (tmp_path / "probe_functions.py").write_text(
        "def double(x):\n    if x > 0:\n        return 2 * x\n    return x\n")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TFRUN_")}
    done = subprocess.run([sys.executable, "-m", "tfrun.in_task.start.bootstrap", str(script), *args],
                          env={**environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    line = next(l for l in done.stdout.splitlines() if l.startswith("PROBE "))
    return json.loads(line[len("PROBE "):])


@pytest.fixture(scope="module", autouse=True)
def _needs_the_optional_packages():
    import importlib.util

    missing = [m for m in ("sklearn", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:  # the dev install has both: there, this always runs
        pytest.skip(f"without {missing} Keras imports neither, deferred or not")


def test_import_keras_leaves_them_and_their_first_use_makes_them(tmp_path):
    got = _probe(tmp_path, "use")
    assert got["at_import"] == {"sklearn": False, "matplotlib.pyplot": False,
                                "scipy.stats": False, "IPython": False}, got
    assert got["used"] == {"an_estimator": True, "classifier": "SKLearnClassifier",
                           "plotting": True, "one_function": True, "no_notebook": True}, got


def test_a_scan_of_every_module_s_file_makes_none_of_them(tmp_path):
    """inspect.getmodule and AutoGraph (a backup's resume converts a gather) read every
    loaded module's ``__file__``: a deferred module answers it unloaded, so the scan
    does not pay the deferred imports (2.8 CPU seconds in every task resuming a backup)."""
    got = _probe(tmp_path, "scan")
    assert got["used"] == {"getmodule": "probe_functions", "converted": 4.0,
                           "wrappers_file": True,
                           "made": {"sklearn": False, "matplotlib.pyplot": False}}, got


def test_defer_imports_0_imports_them_with_keras_as_python_does(tmp_path):
    got = _probe(tmp_path, TFRUN_DEFER_IMPORTS="0")
    assert got["at_import"] == {"sklearn": True, "matplotlib.pyplot": True,
                                "scipy.stats": True, "IPython": True}, got


def test_only_the_listed_modules_are_deferred_and_install_is_idempotent():
    before = list(sys.meta_path)
    try:
        deferred_imports.install()
        deferred_imports.install()
        added = [f for f in sys.meta_path if f not in before]
        assert len(added) == 1 and sys.meta_path[0] is added[0]
        assert added[0].find_spec("json") is None  # everything else: the normal import
        assert added[0].find_spec("keras.wrappers_of_a_later_keras") is None
    finally:
        sys.meta_path[:] = before


def test_a_deferred_module_answers_its_file_unloaded_and_loads_on_anything_else(tmp_path):
    """In one process, on a module of its own: reading ``__file__`` or ``__name__`` runs
    none of its code; reading another name runs it once; deleting a name it answers
    unloaded loads it first, as Python's lazy modules do."""
    import importlib.util

    source = tmp_path / "deferred_probe_module.py"
    source.write_text("import builtins\nbuiltins.deferred_probe_runs += 1\nvalue = 7\n")
    import builtins

    builtins.deferred_probe_runs = 0
    try:
        def lazily_made():
            spec = importlib.util.spec_from_file_location("deferred_probe_module", source)
            spec.loader = deferred_imports._LazyLoader(spec.loader)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module

        module = lazily_made()
        assert module.__file__ == str(source) and module.__name__ == "deferred_probe_module"
        assert builtins.deferred_probe_runs == 0
        assert module.value == 7 and builtins.deferred_probe_runs == 1
        assert module.__file__ == str(source) and builtins.deferred_probe_runs == 1

        module = lazily_made()
        del module.__cached__
        assert builtins.deferred_probe_runs == 2 and not hasattr(module, "__cached__")
    finally:
        del builtins.deferred_probe_runs
