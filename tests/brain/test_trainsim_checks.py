"""trainsim as a TaskD / MindIO stand-in: the payloads the real clients would reject or misread are
reported loudly (``client-error``, ``TrainSim.errors``) and left unanswered (issue 14)."""

from __future__ import annotations

import pytest

from faultmesh._pb import recover_pb2 as pb
from faultmesh.trainsim import TrainSim

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
    assert sim._rejected(s)
    assert "empty faultRanks" in sim.errors[0]
    assert sim.events[-1]["event"] == "client-error"


def test_recover_in_place_without_pods_restarts_no_worker(sim):
    s = sig("changeStrategy", ["change_strategy", "fault_nodes_restart"], [("2", "1")], strategy="recover")
    assert sim._rejected(s) and "restarts no worker" in sim.errors[0]


def test_exit_without_node_rank_ids_sends_no_exit_agent(sim):
    assert sim._rejected(sig("changeStrategy", ["change_strategy"], strategy="exit", extra="dump_exit"))
    assert "exits no agent" in sim.errors[0]


def test_global_fault_must_name_every_rank_of_an_exiting_pod(sim):
    s = sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("3", "1")], pods=["1"])
    assert sim._rejected(s) and "ranks ['2'] exit with their pod" in sim.errors[0]
    ok = sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("2", "1"), ("3", "1")], pods=["1"])
    assert not sim._rejected(ok)


def test_pre_exit_must_name_the_fault_pods(sim):
    assert sim._rejected(sig("preExitProcess", ["pre exit process"], [("2", "1")]))
    assert sim._rejected(sig("preExitProcess", ["pre exit process"], [("2", "1")], pods=["0"]))
    assert not sim._rejected(sig("preExitProcess", ["pre exit process"], [("2", "1")], pods=["1"]))


def test_signals_of_a_flow_share_the_stop_train_uuid(sim):
    assert not sim._rejected(sig("stopTrain", ["stop_train"], [("2", "1")]))
    other = sig("globalFault", ["on_global_rank"], [("2", "0")], uuid="OTHER-" + "1" * 32)
    assert sim._rejected(other) and "not the flow's" in sim.errors[0]


def test_retry_and_a_good_recover_pass(sim):
    assert not sim._rejected(
        sig("changeStrategy", ["change_strategy"], [("2", "0")], ["1"], strategy="retry")
    )
    assert not sim._rejected(
        sig("changeStrategy", ["change_strategy"], [("2", "1"), ("3", "1")], ["1"], strategy="recover")
    )
    assert sim.errors == []


def test_in_place_global_fault_may_exit_no_pod_but_needs_the_ranks(sim):
    # recover-in-place, every fault pod restarts its processes: fault_nodes_exit names no pod
    assert not sim._rejected(sig("globalFault", ["on_global_rank", "fault_nodes_exit"], [("2", "1")]))
    assert sim._rejected(sig("globalFault", ["on_global_rank", "fault_nodes_exit"]))
    assert sim._rejected(sig("globalFault", ["on_global_rank", "fault_nodes_restart"], [("2", "1")]))


def test_in_place_restart_of_a_pod_without_a_fault_rank_is_an_error(sim):
    s = sig(
        "changeStrategy", ["change_strategy", "fault_nodes_restart"], [("2", "1")], ["0", "1"],
        strategy="recover", extra="recover-in-place",
    )  # fmt: skip
    assert sim._rejected(s) and "pods ['0'] restart workers but have no fault rank" in sim.errors[0]
