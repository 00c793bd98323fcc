"""The examples in the modules' docstrings are executed, so they cannot rot.

Every module of the package whose source holds an example (``>>> ``, not all of them
``+SKIP``: those show a call that needs a run) is found here by itself: a hand-kept list
had left 37 modules' examples unrun, two of them wrong.
"""

import doctest
import importlib
from pathlib import Path

import pytest

import tfrun

PACKAGE = Path(tfrun.__file__).parent


def _modules_with_examples() -> list[str]:
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        if not any(">>> " in line and "+SKIP" not in line for line in lines):
            continue
        parts = ("tfrun",) + path.relative_to(PACKAGE).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


MODULES = _modules_with_examples()


def test_the_modules_with_examples_are_found():
    # a broken search would pass every test below by finding nothing
    assert {"tfrun.cluster", "tfrun.launch.supervise.exits",
            "tfrun.launch.remote.protocol"} <= set(MODULES), MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
