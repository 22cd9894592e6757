"""Wire client run in its own process (its stubs must not meet faultmesh's in one descriptor pool).

``python client.py GRPC_ADDR JOB_ID`` drives every service with the test-built stubs and prints
one JSON object of observations on stdout. The job must exist with ranks 0-1 on node-a, 2-3 on
node-b (superPodId 0) and recover-strategy including recover.
"""

from __future__ import annotations

import json
import queue
import sys
import threading
import time

import grpc
import wconfig_pb2 as cfg
import wconfig_pb2_grpc as cfg_grpc
import wfault_pb2 as flt
import wfault_pb2_grpc as flt_grpc
import wjob_pb2 as jb
import wjob_pb2_grpc as jb_grpc
import wprofiling_pb2 as prf
import wprofiling_pb2_grpc as prf_grpc
import wpubfault_pb2 as pub
import wpubfault_pb2_grpc as pub_grpc
import wrecover_pb2 as rc
import wrecover_pb2_grpc as rc_grpc


def reader(stream, q: queue.Queue) -> None:
    try:
        for m in stream:
            q.put(m)
    except grpc.RpcError:
        pass


def main() -> None:
    addr, job = sys.argv[1], sys.argv[2]
    out: dict = {}
    ch = grpc.insecure_channel(addr)
    r = rc_grpc.RecoverStub(ch)
    ci = rc.ClientInfo(jobId=job, role="taskd")
    out["init"] = r.Init(ci).code
    out["register"] = r.Register(ci).code
    out["health"] = r.HealthCheck(ci).info
    sigs: queue.Queue = queue.Queue()
    switch_q: queue.Queue = queue.Queue()
    stress_q: queue.Queue = queue.Queue()
    streams = [
        r.SubscribeProcessManageSignal(ci),
        r.SubscribeNotifySwitch(ci),
        r.SubscribeNotifyExecStressTest(ci),
    ]
    for s, q in zip(streams, (sigs, switch_q, stress_q), strict=True):
        threading.Thread(target=reader, args=(s, q), daemon=True).start()
    time.sleep(0.3)

    def next_signal(timeout=10.0):
        while True:
            m = sigs.get(timeout=timeout)
            if m.signalType != "keep-alive":
                return m
            out["keepalive_seen"] = True

    def status(code):
        return rc.Status(code=code)

    # process fault -> stopTrain -> globalFault -> changeStrategy recover
    out["process_fault"] = r.ReportProcessFault(
        rc.ProcessFaultRequest(jobId=job, faultRanks=[rc.FaultRank(rankId="2", faultType="1")])
    ).code
    seen = []
    m = next_signal()
    seen.append(
        [m.signalType, list(m.actions), [(f.rankId, f.faultType) for f in m.faultRanks], len(m.uuid) > 33]
    )
    r.ReportStopComplete(rc.StopCompleteRequest(jobId=job, status=status(0), faultRanks=m.faultRanks))
    m = next_signal()
    seen.append([m.signalType, list(m.actions), list(m.nodeRankIds)])
    r.ReportRecoverStrategy(
        rc.RecoverStrategyRequest(jobId=job, faultRanks=m.faultRanks, strategies=["recover"])
    )
    m = next_signal()
    seen.append([m.signalType, m.changeStrategy])
    out["recover_status"] = r.ReportRecoverStatus(
        rc.RecoverStatusRequest(jobId=job, status=status(0), strategy="recover")
    ).code
    out["recovery"] = seen
    time.sleep(0.2)

    # NIC switch
    st = r.SwitchNicTrack(rc.SwitchNics(jobID=job, nicOps={"node-b": rc.DeviceList(dev=["1"], op=[True])}))
    out["switch_track"] = [st.code, st.info]
    m = next_signal()
    r.ReportStopComplete(rc.StopCompleteRequest(jobId=job, status=status(0)))
    rl = switch_q.get(timeout=10)
    out["switch_ranks"] = [list(rl.rankID), list(rl.op), rl.jobId, m.signalType, list(m.actions)]
    out["switch_reply"] = r.ReplySwitchNicResult(rc.SwitchResult(jobId=job, result=True)).code
    m = next_signal()
    r.ReportRecoverStatus(rc.RecoverStatusRequest(jobId=job, status=status(0), strategy=m.changeStrategy))
    resp = next(iter(r.SubscribeSwitchNicSignal(rc.SwitchNicRequest(jobID=job), timeout=10)))
    out["switch_result"] = [resp.jobID, resp.msg, m.changeStrategy]
    time.sleep(0.2)

    # stress test
    st = r.StressTest(rc.StressTestParam(jobID=job, stressParam={"node-a": rc.StressOpList(ops=[0, 1])}))
    out["stress_track"] = st.code
    m = next_signal()
    r.ReportStopComplete(rc.StopCompleteRequest(jobId=job, status=status(0)))
    params = stress_q.get(timeout=10)
    out["stress_params"] = {k: list(v.ops) for k, v in params.stressParam.items()}
    res = {
        rank: rc.StressTestRankResult(
            rankResult={str(op): rc.StressTestOpResult(code="0", result="ok") for op in ol.ops}
        )
        for rank, ol in params.stressParam.items()
    }
    out["stress_reply"] = r.ReplyStressTestResult(rc.StressTestResult(jobId=job, stressResult=res)).code
    kinds = []
    while True:
        m = next_signal()
        kinds.append(m.signalType)
        if m.signalType == "changeStrategy":
            r.ReportRecoverStatus(rc.RecoverStatusRequest(jobId=job, status=status(0), strategy="continue"))
            break
    out["stress_signals"] = kinds
    resp = next(iter(r.SubscribeStressTestResponse(rc.StressTestRequest(jobID=job), timeout=10)))
    out["stress_result"] = resp.msg

    # TrainingDataTrace
    t = prf_grpc.TrainingDataTraceStub(ch)
    tq: queue.Queue = queue.Queue()
    threading.Thread(
        target=reader,
        args=(t.SubscribeDataTraceSwitch(prf.ProfilingClientInfo(jobId=job, role="taskd")), tq),
        daemon=True,
    ).start()
    time.sleep(0.2)
    sw = prf.ProfilingSwitch(
        CommunicationOperator="off", Step="on", SaveCheckpoint="on", FP="on", DataLoader="on"
    )
    res = t.ModifyTrainingDataTraceSwitch(prf.DataTypeReq(jobNsName="default/wirejob", profilingSwitch=sw))
    out["trace_modify"] = [res.code, res.message]
    g = t.GetTrainingDataTraceSwitch(prf.DataStatusReq(jobNsName="default/wirejob"))
    out["trace_get"] = [g.code, g.profilingSwitch.Step, g.profilingSwitch.CommunicationOperator]
    m = tq.get(timeout=10)
    out["trace_stream"] = [m.code, m.message, m.profilingSwitch.DataLoader]

    # fault.Fault fed by a public fault
    f = flt_grpc.FaultStub(ch)
    out["fault_register"] = f.Register(flt.ClientInfo(jobId=job, role="platform")).code
    fq: queue.Queue = queue.Queue()
    threading.Thread(
        target=reader,
        args=(f.SubscribeFaultMsgSignal(flt.ClientInfo(jobId=job, role="platform")), fq),
        daemon=True,
    ).start()
    time.sleep(0.2)
    now = int(time.time() * 1000)
    p = pub_grpc.PubFaultStub(ch).SendPublicFault(
        pub.PublicFaultRequest(
            id="wire-test-0001",
            timestamp=now,
            version="1.0",
            resource="CCAE",
            faults=[
                pub.Fault(
                    faultId="wire-fault-0001",
                    faultType="NPU",
                    faultCode="010001001",
                    faultTime=now,
                    assertion="occur",
                    influence=[pub.PubFaultInfo(nodeName="node-b", deviceIds=[0])],
                )
            ],
        )
    )
    out["pubfault"] = [p.code, p.info]
    m = fq.get(timeout=10)
    n = m.nodeFaultInfo[0]
    d = n.faultDevice[0]
    out["fault_stream"] = [
        m.jobId,
        m.signalType,
        n.nodeName,
        n.faultLevel,
        d.deviceId,
        d.deviceType,
        list(d.faultCodes),
        d.faultLevel,
        list(d.faultLevels),
    ]
    q = f.GetFaultMsgSignal(flt.ClientInfo(jobId=job, role="platform"))
    out["fault_get"] = [q.code, q.info, q.faultSignal.jobId, len(q.faultSignal.nodeFaultInfo)]

    # job.Job
    j = jb_grpc.JobStub(ch)
    reg = j.Register(jb.ClientInfo(role="FdAgent"))
    out["job_register"] = [reg.code, len(reg.clientId)]
    lst = next(
        iter(
            j.SubscribeJobSummarySignalList(jb.ClientInfo(role="FdAgent", clientId=reg.clientId), timeout=10)
        )
    )
    s = next(x for x in lst.jobSummarySignals if x.jobId == job)
    out["job_list"] = [
        lst.JobTotalNum,
        s.jobId,
        s.jobName,
        s.namespace,
        s.jobStatus,
        json.loads(s.HcclJson)["server_count"],
    ]
    jq: queue.Queue = queue.Queue()
    threading.Thread(
        target=reader,
        args=(j.SubscribeJobSummarySignal(jb.ClientInfo(role="FdAgent", clientId=reg.clientId)), jq),
        daemon=True,
    ).start()

    # config.Config
    c = cfg_grpc.ConfigStub(ch)
    mindie = sys.argv[3]  # a MindIE service's job id
    out["config_register"] = c.Register(cfg.ClientInfo(jobId=mindie, role="mindie")).code
    rt = next(iter(c.SubscribeRankTable(cfg.ClientInfo(jobId=mindie, role="mindie"), timeout=10)))
    out["config_table"] = [rt.jobId, [g["group_id"] for g in json.loads(rt.rankTable)["server_group_list"]]]
    print(json.dumps(out), flush=True)
    ch.close()


if __name__ == "__main__":
    main()
