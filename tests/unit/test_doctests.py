"""The examples in the pure modules' docstrings are executed, so they cannot rot."""

import doctest

import pytest

import tfrun._native
import tfrun.cluster
import tfrun.comm
import tfrun.errors
import tfrun.heap
import tfrun.launch.config
import tfrun.launch.logs
import tfrun.launch.policy
import tfrun.launch.ports
import tfrun.launch.bench
import tfrun.launch.runstats
import tfrun.shm_allreduce


@pytest.mark.parametrize("module", [tfrun.cluster, tfrun.comm, tfrun.errors, tfrun.heap, tfrun.launch.config, tfrun.launch.logs,
                                    tfrun.launch.policy, tfrun.launch.ports,
                                    tfrun.launch.bench, tfrun.launch.runstats, tfrun._native,
                                    tfrun.shm_allreduce])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
