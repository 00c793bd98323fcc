"""The account of a run's host changes (launch/supervise/membership.py), table-tested."""

import pytest

from tfrun.launch.engines.host_answer import HostAnswer
from tfrun.launch.supervise.membership import Membership


def _lost(members: Membership, when: float, **extra) -> dict:
    return members.change(when, ["node-3"], [], "lost", "no heartbeat",
                          ["worker:0@node-1", "worker:1@node-2", "worker:2@node-3"],
                          ["worker:0@node-1", "worker:1@node-2"], restart=1, **extra)


@pytest.mark.parametrize("events, want", [
    # the first resume after the change counts; earlier and undated ones do not
    ([{"event": "resumed", "time": 90.0, "step": 10},
      {"event": "resumed", "time": 107.0, "step": 41},
      {"event": "resumed", "time": 103.0, "step": 40},
      {"event": "resumed", "step": 39}],
     {"resumed_at_step": 40, "seconds_to_resume": 3.0, "steps_redone": 5}),
    # a resume at a step after the one reached counts no step redone (never negative)
    ([{"event": "resumed", "time": 101.0, "step": 50}],
     {"resumed_at_step": 50, "seconds_to_resume": 1.0, "steps_redone": 0}),
    # not resumed (yet): nothing added, nothing said
    ([{"event": "epoch", "time": 101.0}], {}),
])
def test_a_change_is_completed_by_the_first_resume_after_it(events, want):
    members = Membership(min_nodes=2, keep_global_batch=True)
    change = _lost(members, 100.0, step_reached=45)
    lines = members.complete(events)
    assert {k: change[k] for k in want} == want
    assert ("resumed_at_step" in change) == bool(want)
    assert len(lines) == (1 if want else 0)
    if want:
        assert lines[0] == (f"re-form at restart 1 (lost: node-3): training resumed at step "
                            f"{want['resumed_at_step']}, {want['seconds_to_resume']:g}s after "
                            f"tfrun noticed; {want['steps_redone']} steps redone (at least)")
    assert change["global_batch"] == "kept" and change["min_nodes"] == 2


def test_a_completed_change_is_said_once_and_each_change_finds_its_own_resume():
    members = Membership(min_nodes=2, keep_global_batch=False)
    first = _lost(members, 100.0)
    assert members.complete([{"event": "resumed", "time": 103.0, "step": 40}])
    second = members.change(200.0, [], ["node-3"], "back", "answered again",
                            ["worker:0@node-1"], ["worker:0@node-1", "worker:1@node-3"],
                            restart=2)
    events = [{"event": "resumed", "time": 103.0, "step": 40},
              {"event": "resumed", "time": 205.5, "step": 80}]
    lines = members.complete(events)
    assert lines == ["re-form at restart 2 (back: node-3): training resumed at step 80, "
                     "5.5s after tfrun noticed"]
    assert (first["resumed_at_step"], second["resumed_at_step"]) == (40, 80)
    assert "steps_redone" not in second  # no step_reached: nothing to subtract from
    assert members.complete(events) == []


def test_only_hosts_lost_earlier_and_not_excluded_are_asked_whether_they_answer_again():
    members = Membership(min_nodes=1, keep_global_batch=False)
    asked = []

    def ask(host):
        asked.append(host)
        return HostAnswer(host in {"node-2", "node-4"}, f"{host}: connection refused")

    assert members.answering(ask) == [] and asked == []  # nobody lost yet
    members.away = {"node-2", "node-3", "node-4"}
    members.exclude("node-4")
    assert members.answering(ask) == ["node-2"]
    assert sorted(asked) == ["node-2", "node-3"] and members.excluded == ["node-4"]
    assert members.silent == {"node-3": "node-3: connection refused"}
    members.depart(["worker:1@node-2"])
    members.depart(iter(["worker:2@node-3"]))
    assert members.departed == ["worker:1@node-2", "worker:2@node-3"]


def test_too_few_hosts_names_each_lost_host_that_did_not_answer_and_why():
    members = Membership(min_nodes=3, keep_global_batch=False)
    members.silent = {"node-4": "no answer within 12s (once, 12s allowed)",
                      "node-2": "ssh: connect to host node-2 port 22: No route to host"}
    line = members.too_few("node-3", 2)
    assert line.startswith("node-3 lost: 2 hosts left, --min-nodes 3: too few")
    assert line.endswith("not answering: node-2 (ssh: connect to host node-2 port 22: No "
                         "route to host), node-4 (no answer within 12s (once, 12s allowed))")
    members.silent = {}
    assert members.too_few("node-3", 1).endswith("too few to re-form the cluster")
