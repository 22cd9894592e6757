"""The recovery controller's state table (issue 28: clusterd.brain.states).

Every flow a test drives is checked against the table by tests/conftest.py (a test during which a
controller made an illegal move fails); these tests check the table itself and what an illegal
move does: logged, counted, exported, the move still made, nothing raised.
"""

from __future__ import annotations

import ast
import logging
from collections import Counter
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from clusterd.brain import states
from clusterd.brain.ctlstate import ControllerState

BRAIN = Path(states.__file__).parent
NAMES = {k: v for k, v in vars(states).items() if k.isupper() and isinstance(v, str)}


def set_state_args() -> list[tuple[str, str]]:
    """(file:line, the argument's source) of every ``set_state(...)`` call in clusterd.brain."""
    out = []
    for path in sorted(BRAIN.glob("*.py")):
        for n in ast.walk(ast.parse(path.read_text())):
            if isinstance(n, ast.Call) and getattr(n.func, "attr", getattr(n.func, "id", "")) == "set_state":
                out.append((f"{path.name}:{n.lineno}", ast.unparse(n.args[0])))
    return out


def test_every_state_change_names_a_state_of_the_table():
    calls = set_state_args()
    assert len(calls) >= 35  # the flows' steps (a failed scan would pass the checks below)
    odd = [(where, arg) for where, arg in calls if arg.removeprefix("states.") not in {*NAMES, "state"}]
    assert odd == [], "a state change that is not a constant of clusterd.brain.states"
    assert set(NAMES.values()) == set(states.TRANSITIONS), "a state without its row in the table"
    entered = {  # every states.X the flows name (a set_state argument or the strategy -> state map)
        n.attr
        for path in BRAIN.glob("*.py")
        if path.name != "states.py"
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "states"
    }
    assert set(NAMES) - entered - {"INIT"} == set(), "a state no flow enters"


def test_every_state_is_reachable_from_init_and_every_target_is_a_state():
    targets = {d for row in states.TRANSITIONS.values() for d in row}
    assert targets <= set(states.TRANSITIONS)
    seen, todo = {states.INIT}, [states.INIT]
    while todo:
        for d in states.TRANSITIONS[todo.pop()]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    assert seen == set(states.TRANSITIONS)


def test_legal_moves():
    assert states.allowed(states.INIT, states.NOTIFY_WAIT_FAULT_FLUSHING)
    assert states.allowed(states.NOTIFY_STOP_TRAIN, states.WAIT_REPORT_STOP_COMPLETE)
    assert states.allowed(states.WAIT_REPORT_STOP_COMPLETE, states.INIT)  # a reset, from anywhere
    assert states.allowed(states.NOTIFY_GLOBAL_FAULT, states.NOTIFY_GLOBAL_FAULT)  # staying
    assert states.allowed(states.WAIT_REPORT_RECOVER_STRATEGY, states.NOTIFY_DUMP)  # choosing dump
    assert not states.allowed(states.INIT, states.WAIT_REPORT_STOP_COMPLETE)  # stopTrain skipped
    assert not states.allowed(states.KILL_JOB, states.NOTIFY_STOP_TRAIN)  # killMaster ends the flow
    assert not states.allowed(states.CHECK_RECOVER_RESULT, states.NOTIFY_DECIDED_STRATEGY)


@pytest.fixture
def illegal_counter():
    """The process-wide counter, restored afterwards (the conftest guard fails a test that adds)."""
    before = Counter(states.ILLEGAL)
    yield states.ILLEGAL
    states.ILLEGAL.clear()
    states.ILLEGAL.update(before)


def test_an_illegal_move_is_logged_counted_exported_and_still_made(illegal_counter, caplog):
    reg = CollectorRegistry()
    reg.register(states.IllegalTransitions())
    labels = {"from": states.INIT, "to": states.WAIT_CONTINUE_TRAIN}
    base = reg.get_sample_value("faultmesh_brain_illegal_transitions_total", labels) or 0
    st = ControllerState("job-1")
    with caplog.at_level(logging.WARNING, logger="clusterd.brain"):
        assert st.set_state(states.NOTIFY_PAUSE_TRAIN) is True
        assert st.set_state(states.INIT) is True
        assert st.set_state(states.WAIT_CONTINUE_TRAIN) is False  # skips pause and continue
    assert st.state == states.WAIT_CONTINUE_TRAIN  # behaviour unchanged: the move is made
    assert illegal_counter[(states.INIT, states.WAIT_CONTINUE_TRAIN)] >= 1
    lines = [r.getMessage() for r in caplog.records if "controller illegal transition" in r.getMessage()]
    assert lines == ["controller illegal transition job=job-1 src=INIT dst=WaitContinueTrain"]
    assert reg.get_sample_value("faultmesh_brain_illegal_transitions_total", labels) == base + 1
