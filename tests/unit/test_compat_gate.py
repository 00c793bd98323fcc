"""The compat gate (``tfrun.in_task.compat.internals``) is the one list of the private
TensorFlow and Keras names tfrun touches.

The source scan reads tfrun's own code, so a private name added anywhere without its
line in the gate fails here, before it can fail a user's run on the next TensorFlow:

* every ``from <private module> import name`` and every private module spelled in a
  string (``keras.src...``, ``tensorflow.python...``, ``tf_keras.src...``);
* every ``obj._name`` (or ``getattr(obj, "_name")``) whose name tfrun does not define
  itself -- a module-level or class-level name, or an attribute tfrun sets on ``self``.
  Python's own private names (argparse's actions, ``os._exit``, enum's member map) are
  listed below with why they are not TensorFlow's or Keras'.
"""

from __future__ import annotations

import ast
import re
import warnings
from pathlib import Path

import pytest

from tfrun.in_task import compat
from tfrun.in_task.compat import internals, keras3

pytestmark = pytest.mark.quick

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "tfrun"
PRIVATE_MODULE = re.compile(r"^(keras\.src|tensorflow\.python|tf_keras\.src)(\.|$)")
#: Python's own: argparse's action classes and parser list, os._exit, Enum's member map.
PYTHON_PRIVATE = {"_actions", "_AppendAction", "_HelpAction", "_StoreTrueAction",
                  "_StoreFalseAction", "_exit", "_value2member_map_"}


def _trees() -> dict[Path, ast.AST]:
    return {path: ast.parse(path.read_text(), str(path)) for path in sorted(PACKAGE.rglob("*.py"))}


def _defined_by_tfrun(trees) -> set[str]:
    """Names tfrun defines: at module or class level, and attributes set on self/cls."""
    own: set[str] = set()

    def top_level(body) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
                if isinstance(node, ast.ClassDef):
                    top_level(node.body)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                own.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                own.update((a.asname or a.name).split(".")[0] for a in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                top_level(node.body)
                top_level(node.orelse)
                for handler in getattr(node, "handlers", []):
                    top_level(handler.body)

    for tree in trees.values():
        top_level(tree.body)
        own.update(node.attr for node in ast.walk(tree)
                   if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
                   and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    return own


def _private_attributes(tree) -> set[tuple[str, int]]:
    found = set()
    for node in ast.walk(tree):
        name = None
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in (
                "getattr", "setattr", "hasattr") and len(node.args) > 1 \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            name = node.args[1].value
        if name and name.startswith("_") and not name.endswith("__") \
                and not name.startswith("_tfrun"):  # tfrun's own marks on foreign objects
            found.add((name, node.lineno))
    return found


def _private_modules(tree) -> set[tuple[str, str, int]]:
    """(module, imported name or "", line) of every private module tfrun names."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and PRIVATE_MODULE.match(node.module):
            found.update((node.module, alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update((a.name, "", node.lineno) for a in node.names if PRIVATE_MODULE.match(a.name))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and PRIVATE_MODULE.match(node.value):
            found.add((node.value, "", node.lineno))
    return found


def test_every_private_name_tfrun_touches_is_in_the_gate():
    trees = _trees()
    own = _defined_by_tfrun(trees)
    gated_names = {i.name for i in internals.INTERNALS}
    gated_modules = {i.module for i in internals.INTERNALS}
    gated_imports = {(i.module, i.name) for i in internals.INTERNALS} | {
        (i.module.rpartition(".")[0], i.module.rpartition(".")[2]) for i in internals.INTERNALS
    } | {(i.module, i.owner) for i in internals.INTERNALS if i.owner}
    outside = []
    for path, tree in trees.items():
        where = path.relative_to(PACKAGE)
        if where.name == "internals.py":
            continue
        for name, line in _private_attributes(tree):
            if name not in own and name not in PYTHON_PRIVATE and name not in gated_names:
                outside.append(f"{where}:{line} .{name}")
        for module, name, line in _private_modules(tree):
            if name and (module, name) not in gated_imports:
                outside.append(f"{where}:{line} from {module} import {name}")
            elif not name and module not in gated_modules:
                outside.append(f"{where}:{line} {module!r}")
    assert not outside, "private names outside compat/internals.py's gate:\n" + "\n".join(
        sorted(outside))


def test_the_scan_finds_a_private_name_added_outside_the_gate():
    """The scan is not vacuous: a made-up private attribute and import are reported."""
    tree = ast.parse("import keras\nfrom keras.src.trainers import shiny\n"
                     "def f(model):\n    return model._shiny_new_internal\n")
    assert ("_shiny_new_internal", 4) in _private_attributes(tree)
    assert ("keras.src.trainers", "shiny", 2) in _private_modules(tree)
    assert "_shiny_new_internal" not in _defined_by_tfrun(_trees())


def test_every_gated_name_exists_on_the_pinned_versions():
    """Every name of the gate, for every feature that needs one, is on the installed
    (pinned) versions, and those are the versions it lists as tested."""
    entries = [(i.spelled, i.feature) for i in internals.INTERNALS]
    assert len(entries) == len(set(entries)) >= 80
    features = {i.feature for i in internals.INTERNALS}
    assert set(internals.FALLBACKS) <= features
    assert {internals.fix_feature(name) for name in compat.FIX_NAMES} <= features
    for feature in sorted(features):
        assert internals.missing(None, feature) == [], feature
        assert internals.feature_problem(feature) is None, feature
    for flavour in internals.TESTED:
        assert internals.untested_version(flavour) is None  # the pins are the tested versions


def _bogus(feature: str, flavour: str = "keras") -> internals.Internal:
    return internals.Internal(flavour, "tfrun.in_task.compat.internals", None,
                              "_renamed_in_a_later_version", "a test", feature=feature)


def test_a_fix_whose_name_is_gone_is_skipped_with_one_warning(monkeypatch):
    """A Keras that renamed what a fix wraps: that fix is not applied (the script meets
    Keras as it is) and the task says why; the other fixes still apply."""
    monkeypatch.setattr(internals, "INTERNALS", (_bogus(internals.fix_feature("gone")),))
    monkeypatch.setattr(internals, "_features_checked", {})
    monkeypatch.setattr(compat, "_applied", [])
    applied = []
    fixes = [keras3.Fix(name, "upstream", lambda name=name: applied.append(name))
             for name in ("gone", "kept")]
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        compat._apply("Keras", fixes, "3.15.0")
    assert applied == ["kept"]
    text = " ".join(str(w.message) for w in said)
    assert "compat fix 'gone'" in text and "_renamed_in_a_later_version" in text, text
    assert "the fix is skipped" in text


@pytest.mark.parametrize("feature", [internals.PROMPT_STOP, internals.COMM_DEFAULTS,
                                     internals.DEVICES_NOTE, internals.MMAP_THRESHOLD])
def test_a_start_up_hook_whose_name_is_gone_leaves_tensorflow_as_it_is(monkeypatch, capsys,
                                                                       feature):
    """Each start-up hook checks its names before it wraps anything: on a TensorFlow
    without one the hook wraps nothing, and the task says once what it does instead."""
    from types import SimpleNamespace

    from tfrun.in_task.start import heap, setup
    from tfrun.in_task import runtime

    monkeypatch.setattr(internals, "INTERNALS", (_bogus(feature, "tensorflow"),))
    monkeypatch.setattr(internals, "_features_checked", {})

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the hook read {name} after its check failed")

    module = SimpleNamespace(Context=Untouchable(), CollectiveAllReduceStrategy=Untouchable())
    {internals.PROMPT_STOP: lambda: setup._keep_sigterm_disposition(module),
     internals.COMM_DEFAULTS: lambda: setup._default_communication_options(module),
     internals.DEVICES_NOTE: lambda: runtime._warn_when_devices_are_replaced(None, 2),
     internals.MMAP_THRESHOLD: lambda: heap._after_first_initialisation(module, None, 1),
     }[feature]()
    said = capsys.readouterr().err
    assert f"which {feature} needs: {internals.FALLBACKS[feature]}" in said, said


def test_tfrun_fit_without_the_symbolic_build_builds_the_model_by_calling_it(monkeypatch,
                                                                            capsys):
    """``tfrun.fit`` under parameter servers makes every variable before a step through
    Keras' private symbolic build; on a Keras without it, the model is built by calling
    it on one batch, and the task says so once."""
    import numpy as np
    import tensorflow as tf

    import keras
    from tfrun.in_task import train

    monkeypatch.setattr(internals, "INTERNALS", (_bogus(internals.PS_FIT),))
    monkeypatch.setattr(internals, "_features_checked", {})
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    monkeypatch.setattr(type(model), "_symbolic_build", lambda *a, **k: pytest.fail(
        "the private build was called after its check failed"), raising=False)
    trainer = train._PsTrainer.__new__(train._PsTrainer)
    trainer.model, trainer.strategy = model, tf.distribute.get_strategy()
    data = tf.data.Dataset.from_tensor_slices((np.ones((4, 3), "float32"),
                                               np.zeros((4, 2), "float32"))).batch(2)
    trainer._build(lambda _context: data)
    assert model.built and len(model.weights) == 2
    said = capsys.readouterr().err
    assert "tfrun.fit builds the model by calling it on one batch" in said, said
