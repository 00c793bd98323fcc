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


def test_exit_codes_follow_the_shell_convention():
    assert exit_code_of(-9) == 137 and exit_code_of(-15) == 143 and exit_code_of(0) == 0
    assert exit_code_of(3) == 3


def test_state_transitions_are_documented_and_closed():
    assert set(ALLOWED_TRANSITIONS) == set(TaskState)
    assert TaskState.SUCCEEDED not in ALLOWED_TRANSITIONS[TaskState.PENDING]
    assert all(TaskState.RUNNING in ALLOWED_TRANSITIONS[s] for s in TaskState if s.done)
    assert not TaskState.RUNNING.done and TaskState.STOPPED.done
