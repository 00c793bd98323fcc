"""The examples in the pure modules' docstrings are executed, so they cannot rot."""

import doctest

import pytest

import tfrun.in_task._native
import tfrun.cluster
import tfrun.comm
import tfrun.errors
import tfrun.in_task.collector
import tfrun.in_task.heap
import tfrun.launch.config
import tfrun.launch.output.console
import tfrun.launch.output.noise
import tfrun.launch.output.splitter
import tfrun.launch.output.tasklog
import tfrun.launch.output.tracebacks
import tfrun.launch.supervise.records
import tfrun.launch.supervise.summary
import tfrun.launch.supervise.explain
import tfrun.launch.supervise.policy
import tfrun.launch.ports
import tfrun.flags
import tfrun.launch.run
import tfrun.launch.engines
import tfrun.launch.engines.base
import tfrun.launch.engines.ssh.command
import tfrun.launch.engines.slurm
import tfrun.launch.engines.slurm.allocation
import tfrun.launch.engines.slurm.batch
import tfrun.launch.engines.slurm.srun
import tfrun.cli.bench
import tfrun.launch.runstats
import tfrun.in_task.shm_allreduce
import tfrun.in_task.pod
import tfrun.in_task.isolation
import tfrun.contract
import tfrun.native_cache
import tfrun.launch.loopback
import tfrun.in_task.tcp_allreduce
import tfrun.in_task.tcp_handshake
import tfrun.launch.plan_text
import tfrun.launch.report_progress
import tfrun.launch.supervise.attempt_marks
import tfrun.launch.supervise.membership
import tfrun.launch.run_tmp
import tfrun.launch.engines.host_answer
import tfrun.launch.supervise.diagnose
import tfrun.launch.supervise.hang
import tfrun.launch.supervise.stragglers
import tfrun.in_task.progress
import tfrun.in_task.checkpoint_phase


@pytest.mark.parametrize("module", [tfrun.cluster, tfrun.comm, tfrun.errors, tfrun.in_task.collector, tfrun.in_task.heap, tfrun.launch.config, tfrun.launch.output.console, tfrun.launch.output.noise,
                                    tfrun.launch.output.splitter, tfrun.launch.output.tasklog,
                                    tfrun.launch.output.tracebacks, tfrun.launch.supervise.records,
                                    tfrun.launch.supervise.summary, tfrun.launch.supervise.explain,
                                    tfrun.launch.supervise.policy, tfrun.launch.ports, tfrun.flags,
                                    tfrun.launch.run, tfrun.launch.engines, tfrun.launch.engines.base,
                                    tfrun.launch.engines.ssh.command, tfrun.launch.engines.slurm,
                                    tfrun.launch.engines.slurm.allocation,
                                    tfrun.launch.engines.slurm.batch, tfrun.launch.engines.slurm.srun,
                                    tfrun.cli.bench, tfrun.launch.runstats, tfrun.in_task._native,
                                    tfrun.in_task.shm_allreduce, tfrun.in_task.pod,
                                    tfrun.in_task.isolation, tfrun.contract,
                                    tfrun.native_cache, tfrun.launch.loopback,
                                    tfrun.in_task.tcp_allreduce, tfrun.in_task.tcp_handshake,
                                    tfrun.launch.plan_text, tfrun.launch.report_progress,
                                    tfrun.launch.supervise.attempt_marks,
                                    tfrun.launch.supervise.membership, tfrun.launch.run_tmp,
                                    tfrun.launch.engines.host_answer,
                                    tfrun.launch.supervise.diagnose, tfrun.launch.supervise.hang,
                                    tfrun.launch.supervise.stragglers, tfrun.in_task.progress,
                                    tfrun.in_task.checkpoint_phase])
def test_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
