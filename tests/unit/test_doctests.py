"""The examples in the pure modules' docstrings are executed, so they cannot rot."""

import doctest

import pytest

import tfrun.cluster
import tfrun.errors


@pytest.mark.parametrize("module", [tfrun.cluster, tfrun.errors])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
