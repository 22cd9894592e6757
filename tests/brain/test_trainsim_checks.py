"""trainsim as a TaskD / MindIO stand-in: the payloads the real clients would reject or misread are
reported loudly (``client-error``, ``TrainSim.errors``) and left unanswered (issue 14)."""

from __future__ import annotations

import pytest

from faultmesh._pb import recover_pb2 as pb
from fmtools.trainsim import TrainSim

U = "18C0FFEE-" + "0" * 32


def sig(signal_type, actions=(), ranks=(), pods=(), strategy="", extra="", uuid=U):
    return pb.ProcessManageSignal(
        uuid=uuid,
        jobId="j",
        signalType=signal_type,
        actions=list(actions),
        faultRanks=[pb.FaultRank(rankId=r, faultType=t) for r, t in ranks],
        nodeRankIds=list(pods),
        changeStrategy=strategy,
        extraParams=extra,
    )


@pytest.fixture
def sim():
    return TrainSim("127.0.0.1:1", "j", ranks_per_pod=2)


def test_recover_in_place_with_empty_fault_ranks_is_an_error(sim):
    s = sig(
        "changeStrategy",
        ["change_strategy", "fault_nodes_restart"],
        strategy="recover",
        extra="recover-in-place",
    )
    assert sim.checks.rejected(s)
    assert "empty faultRanks" in sim.errors[0]
    assert sim.events[-1]["event"] == "client-error"


def test_recover_in_place_without_pods_restarts_no_worker(sim):
    s = sig("changeStrategy", ["change_strategy", "fault_nodes_restart"], [("2", "1")], strategy="recover")
    assert sim.checks.rejected(s) and "restarts no worker" in sim.errors[0]


def test_exit_without_node_rank_ids_sends_no_exit_agent(sim):
    assert sim.checks.rejected(sig("changeStrategy", ["change_strategy"], strategy="exit", extra="dump_exit"))
    assert "exits no agent" in sim.errors[0]


def test_global_fault_must_name_every_rank_of_an_exiting_pod(sim):
    s = sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("3", "1")], pods=["1"])
    assert sim.checks.rejected(s) and "ranks ['2'] exit with their pod" in sim.errors[0]
    ok = sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("2", "1"), ("3", "1")], pods=["1"])
    assert not sim.checks.rejected(ok)


def test_pre_exit_must_name_the_fault_pods(sim):
    assert sim.checks.rejected(sig("preExitProcess", ["pre exit process"], [("2", "1")]))
    assert sim.checks.rejected(sig("preExitProcess", ["pre exit process"], [("2", "1")], pods=["0"]))
    assert not sim.checks.rejected(sig("preExitProcess", ["pre exit process"], [("2", "1")], pods=["1"]))


def test_signals_of_a_flow_share_the_stop_train_uuid(sim):
    assert not sim.checks.rejected(sig("stopTrain", ["stop_train"], [("2", "1")]))
    other = sig("globalFault", ["on_global_rank"], [("2", "0")], uuid="OTHER-" + "1" * 32)
    assert sim.checks.rejected(other) and "not the flow's" in sim.errors[0]


def test_retry_and_a_good_recover_pass(sim):
    assert not sim.checks.rejected(
        sig("changeStrategy", ["change_strategy"], [("2", "0")], ["1"], strategy="retry")
    )
    assert not sim.checks.rejected(
        sig("changeStrategy", ["change_strategy"], [("2", "1"), ("3", "1")], ["1"], strategy="recover")
    )
    assert sim.errors == []


def test_in_place_global_fault_may_exit_no_pod_but_needs_the_ranks(sim):
    # recover-in-place, every fault pod restarts its processes: fault_nodes_exit names no pod
    assert not sim.checks.rejected(sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("2", "1")]))
    assert sim.checks.rejected(sig("globalFault", ["on_global_rank", "fault_nodes_exit"]))
    assert sim.checks.rejected(sig("globalFault", ["on_global_rank", "fault_nodes_restart"], [("2", "1")]))


def test_in_place_restart_of_a_pod_without_a_fault_rank_is_an_error(sim):
    s = sig(
        "changeStrategy", ["change_strategy", "fault_nodes_restart"], [("2", "1")], ["0", "1"],
        strategy="recover", extra="recover-in-place",
    )  # fmt: skip
    assert sim.checks.rejected(s) and "pods ['0'] restart workers but have no fault rank" in sim.errors[0]


# -- the client in front of MindIO: TaskD's Go manager (role taskd) or the Python client --------------


class FakeStub:
    """Records the RPCs a trainsim sends; every answer has ``code`` (Register: 0)."""

    def __init__(self, code: int = 0) -> None:
        self.code = code
        self.calls: list[tuple[str, object]] = []

    def __getattr__(self, name):
        async def call(request, **_):
            self.calls.append((name, request))
            return pb.Status(code=0 if name == "Register" else self.code)

        return call

    def names(self) -> list[str]:
        return [n for n, _ in self.calls]


def wired(role: str = "taskd", code: int = 0, **kw) -> tuple[TrainSim, FakeStub]:
    sim = TrainSim("127.0.0.1:1", "j", role=role, ranks_per_pod=2, **kw)
    sim.stub = FakeStub(code)
    sim.checks.taskd_tick_s = 0.0  # these tests send signals back to back (the tick: its own test)
    return sim, sim.stub


STOP = ("stopTrain", ["stop_train"])
PRE = ("preExitProcess", ["pre exit process"])
GF = ("globalFault", ["on_global_rank", "fault_nodes_exit"])


async def test_taskd_drops_a_rank_that_is_not_a_number():
    # utils GetFaultRanksMapByList: strconv.Atoi on rankId and faultType, a failing pair skipped
    sim, stub = wired()
    await sim._answer(sig(*STOP, [("2", "1"), ("r3", "1")]))
    await sim._answer(sig(*STOP, [("2", "")], uuid="U2"))
    assert stub.calls == [] and len(sim.errors) == 2
    assert "[('r3', '1')] are not numbers" in sim.errors[0] and "[('2', '')]" in sim.errors[1]
    await sim._answer(sig(*STOP, [("+2", "1")], uuid="U3"))  # Atoi takes a sign
    assert stub.names() == ["ReportStopComplete"]


async def test_taskd_forwards_stop_train_once_until_global_fault_or_change_strategy():
    # stop_train.go: HasSendMessages keyed by signal type + actions, cleared only by a globalFault /
    # changeStrategy while the plugin holds the token
    sim, stub = wired()
    await sim._answer(sig(*STOP, [("2", "1")]))
    await sim._answer(sig(*STOP, [("2", "1")], uuid="U2"))  # a new flow, no release between
    assert stub.names() == ["ReportStopComplete"]
    assert 'stop-train plugin already forwarded stopTrain["stop_train"]' in sim.errors[0]
    sim.errors.clear()
    await sim._answer(sig(*GF, [("2", "1"), ("3", "1")], ["1"], uuid="U2"))  # releases, forgets
    await sim._answer(sig(*STOP, [("2", "1")], uuid="U3"))
    await sim._answer(sig("stopTrain", ["pause_train"], uuid="U4"))  # other actions: another key
    assert stub.names() == [
        "ReportStopComplete",
        "ReportRecoverStrategy",
        "ReportStopComplete",
        "ReportStopComplete",
    ]
    assert sim.errors == []


async def test_taskd_pre_exit_during_a_flow_makes_the_next_stop_train_dropped():
    # a preExitProcess while the plugin holds the token releases it without clearing what was
    # sent, and the flow's globalFault / changeStrategy then reach other plugins only
    sim, stub = wired()
    await sim._answer(sig(*STOP, [("2", "1")]))
    await sim._answer(sig(*PRE, [("1", "1")], ["0"], uuid="P1"))
    await sim._answer(sig(*GF, [("0", "1"), ("1", "1"), ("2", "1"), ("3", "1")], ["0", "1"]))
    await sim._answer(sig("changeStrategy", ["change_strategy"], [("0", "1"), ("1", "1"), ("2", "1"),
                                                                  ("3", "1")], ["0", "1"], strategy="recover"))  # fmt: skip
    assert sim.errors == []
    await sim._answer(sig(*PRE, [("2", "1")], ["1"], uuid="P2"))  # the next fault
    await sim._answer(sig(*PRE, [("2", "1")], ["1"], uuid="P2"))  # the same uuid again: ignored
    assert "last preExitProcess's uuid" in sim.errors[0]
    await sim._answer(sig(*STOP, [("2", "1")], uuid="U2"))
    assert stub.names().count("ReportStopComplete") == 1 and "already forwarded" in sim.errors[1]
    await sim._answer(sig("killMaster", uuid="K"))  # the job is killed: a new TaskD, a fresh plugin
    await sim._answer(sig(*STOP, [("2", "1")], uuid="U3"))
    assert stub.names().count("ReportStopComplete") == 2 and len(sim.errors) == 2


async def test_taskd_sends_the_fault_ranks_as_isolate_rank_ids_with_every_status():
    # manager.go reportRecoverStatus: IsolateRankIds = the keys of MindIO's fault ranks, any code
    sim, stub = wired()
    await sim._answer(
        sig("changeStrategy", ["change_strategy"], [("2", "1"), ("3", "1")], ["1"], strategy="recover")
    )
    ((name, req),) = stub.calls
    assert name == "ReportRecoverStatus" and req.status.code == 0 and list(req.isolateRankIds) == ["2", "3"]
    py, pstub = wired(role="master agent")
    await py._answer(sig("changeStrategy", ["change_strategy"], [("2", "1")], ["1"], strategy="recover"))
    assert list(pstub.calls[0][1].isolateRankIds) == []  # recover_manager.py sets none


async def test_report_codes_taskd_ignores_them_the_python_client_registers_and_resends():
    sim, stub = wired(code=504)
    await sim._answer(sig(*STOP, [("2", "1")]))
    assert stub.names() == ["ReportStopComplete"]  # manager.go: only a gRPC error is retried
    py, pstub = wired(role="master agent", code=504)
    await py._answer(sig(*STOP, [("2", "1")]))
    assert pstub.names() == ["ReportStopComplete", "Register", "ReportStopComplete"]  # once more


async def test_python_client_drops_foreign_empty_and_unregistered_signals():
    # recover_manager.py __signal_pipe_line: no actions -> ignored; another jobId -> discarded;
    # an action outside action_func_map -> "unregistered"
    py, stub = wired(role="master agent")
    await py._answer(sig("stopTrain", [], [("2", "1")]))
    foreign = sig(*STOP, [("2", "1")])
    foreign.jobId = "other"
    await py._answer(foreign)
    await py._answer(sig(*PRE, [("2", "1")], ["1"]))
    assert stub.calls == [] and len(py.errors) == 3
    assert "no actions" in py.errors[0] and "'other' is not 'j'" in py.errors[1]
    assert "none is registered" in py.errors[2]
    await py._answer(sig("killMaster"))  # handled before the actions check, nothing sent
    assert stub.calls == [] and len(py.errors) == 3


async def test_python_client_stream_breaks_on_a_rank_int_cannot_parse():
    # int(item.rankId) raises out of __listen_signal: start_subscribe Inits, Registers, subscribes again
    from fmtools.trainsim import ClientStreamBroken

    py, stub = wired(role="master agent")
    with pytest.raises(ClientStreamBroken):
        await py._answer(sig(*STOP, [("r2", "1")]))
    assert stub.calls == [] and "int()" in py.errors[0]
    sim, _ = wired()  # TaskD's Go manager: the same rank is only dropped
    await sim._answer(sig(*STOP, [("r2", "1")]))
    assert "not numbers" in sim.errors[0]


async def test_taskd_two_commands_within_its_tick_with_no_answer_between_is_an_error():
    # manager.go Process: one snapshot a second; storage ClusterInfos.Command holds only the latest
    # ClusterD command, so the earlier of two commands less than a tick apart may never be seen
    sim, stub = wired()
    sim.checks.taskd_tick_s = 1.0
    await sim._answer(sig("hot-switch", ["hot switch"], [("2", "1"), ("3", "1")]))  # answered by nothing
    await sim._answer(sig("hot-switch", ["new pod running"], [("2", "1")]))
    assert "hot-switch came" in sim.errors[0] and "may never reach MindIO" in sim.errors[0]
    sim.errors.clear()
    await sim._answer(sig("pauseStartAgent", ["pause_start_agent"]))  # handled at once, no command
    assert sim.errors == []
    sim.checks.last_cmd = ("stopTrain", sim.checks.last_cmd[1] - 1.0)  # a tick ago
    await sim._answer(sig(*STOP, [("2", "1")], uuid="U2"))
    await sim._answer(sig(*GF, [("2", "1"), ("3", "1")], ["1"], uuid="U2"))  # after an answer
    assert sim.errors == [] and stub.names()[-2:] == ["ReportStopComplete", "ReportRecoverStrategy"]


def test_hot_switch_without_every_rank_of_the_pod_is_an_error(sim):
    # MindIO waits in the backup pod for every rank of the switched pod (notifyPrepareHotSwitch ->
    # normalFaultAssociateSameNodeRank): rank 3 shares pod 1 with the fault rank 2
    assert sim.checks.rejected(sig("hot-switch", ["hot switch"], [("2", "1")]))
    assert "ranks ['3'] of the switched pod" in sim.errors[0]
    sim.errors.clear()
    assert not sim.checks.rejected(sig("hot-switch", ["hot switch"], [("2", "1"), ("3", "1")]))
    assert not sim.checks.rejected(sig("hot-switch", ["new pod running"], [("2", "1")]))  # only "hot switch"
    assert sim.errors == []


def test_fault_nodes_exit_of_a_pod_that_exited_at_the_global_fault_is_an_error(sim):
    # elastic scale-in: the fault pods exit at the globalFault; faultNodesExit names only the other
    # isolated pods (handleCheckScaleStrategyRecoverResult -> RemoveDuplicateNodeRanks)
    assert not sim.checks.rejected(sig("stopTrain", ["stop_train"], [("2", "1")]))
    gf = sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("2", "1"), ("3", "1")], pods=["1"])
    assert not sim.checks.rejected(gf)
    assert sim.checks.rejected(sig("faultNodesExit", ["fault_nodes_exit"], pods=["1", "2"]))
    assert "pods ['1'] exited at the globalFault already" in sim.errors[0]
    sim.errors.clear()
    assert not sim.checks.rejected(sig("faultNodesExit", ["fault_nodes_exit"], pods=["2"]))
    assert not sim.checks.rejected(
        sig("stopTrain", ["stop_train"], [("2", "1")], uuid="18C0FFEF-" + "0" * 32)
    )
    assert not sim.checks.rejected(sig("faultNodesExit", ["fault_nodes_exit"], pods=["1"]))  # a new flow
    assert sim.errors == []
