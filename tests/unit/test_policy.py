"""The failure policy, table-tested: every rule, no processes."""

import pytest

from tfrun.launch.supervise.policy import (ALLOWED_TRANSITIONS, Decision, FailurePolicy, TaskExit, TaskState,
                                 exit_code_of)

R, F, I = Decision.RESTART, Decision.FAIL, Decision.IGNORE


@pytest.mark.parametrize("role, code, tracked, restarts, max_restarts, expected", [
    # tracked success is progress
    ("worker", 0, True, 0, 0, I),
    ("chief", 0, True, 3, 1, I),
    # failures without budget fail, with budget restart the group
    ("worker", 1, True, 0, 0, F),
    ("worker", 1, True, 0, 2, R),
    ("worker", 1, True, 1, 2, R),
    ("worker", 1, True, 2, 2, F),
    ("chief", 137, True, 0, 1, R),
    # usage errors never restart
    ("worker", 2, True, 0, 5, F),
    ("chief", 2, True, 0, 5, F),
    ("ps", 2, False, 0, 5, F),
    # ps: any exit while training runs is fatal (or a restart)
    ("ps", 1, False, 0, 0, F),
    ("ps", 0, False, 0, 0, F),
    ("ps", 143, False, 0, 1, R),
    # untracked worker (PS mode): a server the coordinator can lose; restarted alone
    ("worker", 0, False, 0, 0, I),
    # evaluator never stops training
    ("evaluator", 0, False, 0, 0, I),
    ("evaluator", 1, False, 0, 0, I),
    ("evaluator", 2, False, 0, 3, I),
])
def test_decisions(role, code, tracked, restarts, max_restarts, expected):
    event = TaskExit(role=role, exit_code=code, tracked=tracked, restarts=restarts)
    assert FailurePolicy(max_restarts=max_restarts).decide(event) is expected


@pytest.mark.parametrize("code, task_restarts, max_task_restarts, max_restarts, expected", [
    (137, 0, 3, 0, Decision.RESTART_TASK),
    (1, 2, 3, 0, Decision.RESTART_TASK),
    (1, 3, 3, 0, F),      # its own budget is spent
    (1, 3, 3, 1, R),      # ... then a gang restart if one is left
    (2, 0, 3, 0, F),      # usage error: never
    (0, 0, 3, 0, I),
])
def test_parameter_server_workers_are_restarted_alone(code, task_restarts, max_task_restarts,
                                                     max_restarts, expected):
    event = TaskExit(role="worker", exit_code=code, tracked=False, restarts=0,
                     task_restarts=task_restarts)
    policy = FailurePolicy(max_restarts=max_restarts, max_task_restarts=max_task_restarts)
    assert policy.decide(event) is expected


def test_a_preempted_parameter_server_worker_is_restarted_alone_without_its_budget():
    """Issue 32: a preemption is not the worker's fault: it does not use up
    --max-worker-restarts (0 here), up to max_preemptions in a row."""
    from tfrun.launch.supervise.policy import FailureClass

    policy = FailurePolicy(max_restarts=0, max_task_restarts=0, max_preemptions=2)

    def decide(failure, task_preemptions=0):
        return policy.decide(TaskExit(role="worker", exit_code=143, tracked=False, restarts=0,
                                      failure=failure, task_preemptions=task_preemptions))

    assert decide(FailureClass.PREEMPTED) is Decision.RESTART_TASK
    assert decide(FailureClass.PREEMPTED, task_preemptions=1) is Decision.RESTART_TASK
    # then the whole group, as any preemption (not charged either)
    assert decide(FailureClass.PREEMPTED, task_preemptions=2) is R
    assert decide(FailureClass.INFRASTRUCTURE) is F  # charged: its budget is 0


def test_exit_codes_follow_the_shell_convention():
    assert exit_code_of(-9) == 137 and exit_code_of(-15) == 143 and exit_code_of(0) == 0
    assert exit_code_of(3) == 3


def test_state_transitions_are_documented_and_closed():
    assert set(ALLOWED_TRANSITIONS) == set(TaskState)
    assert TaskState.SUCCEEDED not in ALLOWED_TRANSITIONS[TaskState.PENDING]
    assert all(TaskState.RUNNING in ALLOWED_TRANSITIONS[s] for s in TaskState if s.done)
    assert not TaskState.RUNNING.done and TaskState.STOPPED.done


# ---------------------------------------------------------------- failure classes

from tfrun.launch.supervise.policy import (LOST_EXIT_CODE, FailureClass,  # noqa: E402
                                           backoff_seconds, classify_exit)

C = FailureClass


@pytest.mark.parametrize("code, note, log, expected", [
    (0, None, "", None),
    (1, None, "Traceback ...\nValueError: bad", C.SCRIPT_ERROR),
    (3, None, "", C.SCRIPT_ERROR),
    (2, None, "usage: ...", C.USAGE),
    (143, None, "", C.PREEMPTED),                       # SIGTERM tfrun did not send
    (137, None, "", C.INFRASTRUCTURE),                  # SIGKILL: the OOM killer, an operator
    (LOST_EXIT_CODE, "connection lost", "", C.NODE_LOST),
    (LOST_EXIT_CODE, None, "", C.SCRIPT_ERROR),         # a script's own exit 255
    (1, None, "E1124 ... The following tasks are unhealthy (stopped sending heartbeats):\n"
              "/job:worker/replica:0/task:1\n", C.INFRASTRUCTURE),
    (1, None, "Task /job:worker/replica:0/task:0 heartbeat timeout.", C.INFRASTRUCTURE),
    # issue 44.4: the fault matrix's classes
    (139, None, "Fatal Python error: Segmentation fault", C.CRASH),
    (134, None, "", C.CRASH),                           # SIGABRT (a failed CHECK in C++)
    (137, "killed by the kernel's out-of-memory killer: its memory cgroup /x (limit 1.0 GiB) "
          "ran out of memory (1 OOM kill(s) there while the task ran)", "", C.OUT_OF_MEMORY),
    (137, "killed by SIGKILL; the kernel's OOM killer ended 1 process(es) on this machine "
          "while it ran: perhaps this one", "", C.INFRASTRUCTURE),  # not its own cgroup's
    (1, None, "Traceback ...\ntensorflow.python.framework.errors_impl.ResourceExhaustedError: "
              "OOM when allocating tensor", C.OUT_OF_MEMORY),
    (1, None, "Traceback ...\nMemoryError", C.OUT_OF_MEMORY),
    (1, None, "Traceback ...\nOSError: [Errno 28] No space left on device", C.DISK_FULL),
    (1, None, "RuntimeError: Unable to synchronously create file (file write failed: "
              "errno = 28, error message = 'No space left on device')", C.DISK_FULL),
    # an old OOM far above the last error is not the last error
    (1, None, "MemoryError\n" + "x" * 20_000 + "\nValueError: bad", C.SCRIPT_ERROR),
])
def test_exits_are_classified(code, note, log, expected):
    assert classify_exit(code, note=note, log_tail=log) is expected


def test_a_sigterm_exit_after_tfruns_own_watch_stopped_the_task_is_not_a_preemption():
    assert classify_exit(143, stopped_by_watch=True) is C.STOPPED_BY_WATCH
    assert classify_exit(137, stopped_by_watch=True) is C.INFRASTRUCTURE  # killed: not its stop
    assert classify_exit(143, stopped_by_watch=False) is C.PREEMPTED


@pytest.mark.parametrize("failure, restarts, preemptions, repeated, max_restarts, expected", [
    # a preemption restarts even with no budget, and does not use it up
    (C.PREEMPTED, 0, 0, False, 0, R),
    (C.PREEMPTED, 5, 99, False, 5, R),
    (C.PREEMPTED, 0, 100, False, 0, F),       # the preemption cap
    (C.PREEMPTED, 0, 100, False, 1, R),       # ... then the budget applies
    # node lost and infrastructure use the budget like a script error
    (C.NODE_LOST, 0, 0, False, 1, R),
    (C.NODE_LOST, 1, 0, False, 1, F),
    (C.INFRASTRUCTURE, 0, 0, False, 2, R),
    # the same script error as the attempt before is not retried, budget or not
    (C.SCRIPT_ERROR, 1, 0, True, 5, F),
    (C.SCRIPT_ERROR, 1, 0, False, 5, R),
    (C.INFRASTRUCTURE, 1, 0, True, 5, R),     # "repeated" is about the script's errors only
    # tfrun's own stop of a task is charged like any failure, never free
    (C.STOPPED_BY_WATCH, 0, 0, False, 0, F),
    (C.STOPPED_BY_WATCH, 0, 0, False, 1, R),
    (C.STOPPED_BY_WATCH, 1, 0, False, 1, F),
])
def test_restart_policy_by_failure_class(failure, restarts, preemptions, repeated, max_restarts,
                                         expected):
    code = {C.PREEMPTED: 143, C.NODE_LOST: LOST_EXIT_CODE, C.INFRASTRUCTURE: 137}.get(failure, 1)
    event = TaskExit(role="worker", exit_code=code, tracked=True, restarts=restarts,
                     failure=failure, preemptions=preemptions, repeated=repeated)
    assert FailurePolicy(max_restarts=max_restarts).decide(event) is expected


@pytest.mark.parametrize("max_preemptions, preemptions, expected", [(0, 0, F), (1, 0, R),
                                                                    (1, 1, F), (3, 2, R)])
def test_max_preemptions_caps_the_free_restarts(max_preemptions, preemptions, expected):
    event = TaskExit(role="worker", exit_code=143, tracked=True, restarts=0,
                     failure=C.PREEMPTED, preemptions=preemptions)
    assert FailurePolicy(max_preemptions=max_preemptions).decide(event) is expected


def test_backoff_grows_exponentially_from_an_immediate_first_restart():
    assert [backoff_seconds(n) for n in range(1, 9)] == [0, 1, 2, 4, 8, 16, 32, 60]
    assert backoff_seconds(3, base=0.5, cap=1.5) == 1.0 and backoff_seconds(9, cap=5) == 5


def test_a_lost_host_reforms_the_cluster_while_min_nodes_are_left():
    """Issue 33: NODE_LOST with --min-nodes: REFORM while enough hosts are left (not
    charged to --max-restarts 0); below the floor, or without --min-nodes, the usual
    rules (here: fail, no restarts left)."""
    from tfrun.launch.supervise.policy import FailureClass

    def decide(min_nodes, nodes_left, failure=FailureClass.NODE_LOST):
        return FailurePolicy(max_restarts=0, min_nodes=min_nodes).decide(TaskExit(
            role="worker", exit_code=255, tracked=True, restarts=0, failure=failure,
            nodes_left=nodes_left))

    assert decide(2, 2) is Decision.REFORM
    assert decide(2, 1) is F
    assert decide(None, None) is F
    assert decide(2, 2, failure=FailureClass.SCRIPT_ERROR) is F  # a bug is not a lost host


def test_a_host_failing_for_the_infrastructure_in_a_row_is_excluded():
    """Issue 33: SIGKILLed from outside --exclude-after (2) times in a row on one host:
    REFORM without it (a spare joins); the first time, the usual restart."""
    from tfrun.launch.supervise.policy import FailureClass

    def decide(host_failures, nodes_left=2):
        return FailurePolicy(max_restarts=1, min_nodes=2, exclude_after=2).decide(TaskExit(
            role="worker", exit_code=137, tracked=True, restarts=0,
            failure=FailureClass.INFRASTRUCTURE, nodes_left=nodes_left,
            host_failures=host_failures))

    assert decide(1) is R
    assert decide(2) is Decision.REFORM
    assert decide(2, nodes_left=1) is R  # below the floor: the usual rules
