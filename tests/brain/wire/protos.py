"""The six upstream protos, written for this test from the field tables of clusterd.md §2 (not from proto/).

Each message lists the reference's field names and numbers; each service its RPC names. If
faultmesh's serving protos drift from the reference, a client built from these fails.
"""

RECOVER = """
syntax = "proto3";
service Recover {
  rpc Init(ClientInfo) returns (Status);
  rpc Register(ClientInfo) returns (Status);
  rpc SubscribeProcessManageSignal(ClientInfo) returns (stream ProcessManageSignal);
  rpc ReportStopComplete(StopCompleteRequest) returns (Status);
  rpc ReportRecoverStrategy(RecoverStrategyRequest) returns (Status);
  rpc ReportRecoverStatus(RecoverStatusRequest) returns (Status);
  rpc ReportProcessFault(ProcessFaultRequest) returns (Status);
  rpc HealthCheck(ClientInfo) returns (Status);
  rpc SwitchNicTrack(SwitchNics) returns (Status);
  rpc SubscribeSwitchNicSignal(SwitchNicRequest) returns (stream SwitchNicResponse);
  rpc SubscribeNotifySwitch(ClientInfo) returns (stream SwitchRankList);
  rpc ReplySwitchNicResult(SwitchResult) returns (Status);
  rpc StressTest(StressTestParam) returns (Status);
  rpc SubscribeStressTestResponse(StressTestRequest) returns (stream StressTestResponse);
  rpc SubscribeNotifyExecStressTest(ClientInfo) returns (stream StressTestRankParams);
  rpc ReplyStressTestResult(StressTestResult) returns (Status);
}
message Status { int32 code = 1; string info = 2; }
message ClientInfo { string jobId = 1; string role = 2; }
message FaultRank { string rankId = 1; string faultType = 2; }
message ProcessManageSignal {
  string uuid = 1; string jobId = 2; string signalType = 3; repeated string actions = 4;
  repeated FaultRank faultRanks = 5; string changeStrategy = 6; int64 timeout = 7;
  repeated string nodeRankIds = 8; string extraParams = 9;
}
message StopCompleteRequest { string jobId = 1; Status status = 2; repeated FaultRank faultRanks = 3; }
message RecoverStrategyRequest { string jobId = 1; repeated FaultRank faultRanks = 2; repeated string strategies = 3; }
message RecoverStatusRequest { string jobId = 1; Status status = 2; string strategy = 3; repeated string isolateRankIds = 4; }
message ProcessFaultRequest { string jobId = 1; repeated FaultRank faultRanks = 2; }
message DeviceList { repeated string dev = 1; repeated bool op = 2; }
message SwitchNics { string jobID = 1; map<string, DeviceList> nicOps = 2; }
message SwitchNicRequest { string jobID = 1; }
message SwitchNicResponse { string jobID = 1; string msg = 2; }
message SwitchRankList { repeated string rankID = 1; repeated bool op = 2; string jobId = 3; }
message SwitchResult { string jobId = 1; bool result = 2; }
message StressOpList { repeated int64 ops = 1; }
message StressTestParam { string jobID = 1; map<string, StressOpList> stressParam = 2; repeated int64 allNodesOps = 3; }
message StressTestRequest { string jobID = 1; }
message StressTestResponse { string jobID = 1; string msg = 2; }
message StressTestRankParams { map<string, StressOpList> stressParam = 1; string jobId = 2; }
message StressTestResult { string jobId = 1; map<string, StressTestRankResult> stressResult = 2; }
message StressTestRankResult { map<string, StressTestOpResult> rankResult = 1; }
message StressTestOpResult { string code = 1; string result = 2; }
"""

PROFILING = """
syntax = "proto3";
service TrainingDataTrace {
  rpc ModifyTrainingDataTraceSwitch(DataTypeReq) returns (DataTypeRes);
  rpc GetTrainingDataTraceSwitch(DataStatusReq) returns (DataStatusRes);
  rpc SubscribeDataTraceSwitch(ProfilingClientInfo) returns (stream DataStatusRes);
}
message ProfilingClientInfo { string jobId = 1; string role = 2; }
message ProfilingSwitch {
  string CommunicationOperator = 1; string Step = 2; string SaveCheckpoint = 3; string FP = 4; string DataLoader = 5;
}
message DataStatusReq { string jobNsName = 1; }
message DataStatusRes { string message = 1; ProfilingSwitch profilingSwitch = 2; int32 code = 3; }
message DataTypeReq { string jobNsName = 1; ProfilingSwitch profilingSwitch = 2; }
message DataTypeRes { string message = 1; int32 code = 2; }
"""

PUBFAULT = """
syntax = "proto3";
service PubFault { rpc SendPublicFault(PublicFaultRequest) returns (RespStatus); }
message RespStatus { int32 code = 1; string info = 2; }
message PublicFaultRequest {
  string id = 1; int64 timestamp = 2; string version = 3; string resource = 4; repeated Fault faults = 5;
}
message Fault {
  string faultId = 1; string faultType = 2; string faultCode = 3; int64 faultTime = 4; string assertion = 5;
  map<string, string> faultLocation = 6; repeated PubFaultInfo influence = 7; string description = 8;
}
message PubFaultInfo { string nodeName = 1; string nodeSN = 2; repeated int32 deviceIds = 3; }
"""

FAULT = """
syntax = "proto3";
package fault;
service Fault {
  rpc Register(ClientInfo) returns (Status);
  rpc SubscribeFaultMsgSignal(ClientInfo) returns (stream FaultMsgSignal);
  rpc GetFaultMsgSignal(ClientInfo) returns (FaultQueryResult);
}
message FaultQueryResult { int32 code = 1; string info = 2; FaultMsgSignal faultSignal = 3; }
message Status { int32 code = 1; string info = 2; }
message ClientInfo { string jobId = 1; string role = 2; }
message FaultMsgSignal { string uuid = 1; string jobId = 2; string signalType = 3; repeated NodeFaultInfo nodeFaultInfo = 4; }
message NodeFaultInfo {
  string nodeName = 1; string nodeIP = 2; string nodeSN = 3; string faultLevel = 4; repeated DeviceFaultInfo faultDevice = 5;
}
message SwitchFaultInfo {
  string faultCode = 1; string switchChipId = 2; string switchPortId = 3; string faultTime = 4; string faultLevel = 5;
}
message DeviceFaultInfo {
  string deviceId = 1; string deviceType = 2; repeated string faultCodes = 3; string faultLevel = 4;
  repeated string faultType = 5; repeated string faultReason = 6; repeated SwitchFaultInfo switchFaultInfos = 7;
  repeated string faultLevels = 8;
}
"""

JOB = """
syntax = "proto3";
package job;
service Job {
  rpc Register(ClientInfo) returns (Status);
  rpc SubscribeJobSummarySignal(ClientInfo) returns (stream JobSummarySignal);
  rpc SubscribeJobSummarySignalList(ClientInfo) returns (stream JobSummarySignalList);
}
message ClientInfo { string role = 1; string clientId = 3; }
message Status { int32 code = 1; string info = 2; string clientId = 3; }
message JobSummarySignal {
  string uuid = 1; string jobId = 2; string jobName = 3; string namespace = 4; string frameWork = 5;
  string jobStatus = 6; string time = 7; string cmIndex = 8; string total = 9; string HcclJson = 10;
  string deleteTime = 11; string sharedTorIp = 12; string masterAddr = 13; string operator = 14; string sid = 15;
}
message JobSummarySignalList { repeated JobSummarySignal jobSummarySignals = 1; string ReportTime = 2; int32 JobTotalNum = 3; }
"""

CONFIG = """
syntax = "proto3";
package config;
service Config {
  rpc Register(ClientInfo) returns (Status);
  rpc SubscribeRankTable(ClientInfo) returns (stream RankTableStream);
}
message ClientInfo { string jobId = 1; string role = 2; }
message Status { int32 code = 1; string info = 2; }
message RankTableStream { string jobId = 1; string rankTable = 2; }
"""

ALL = {
    "wrecover": RECOVER,
    "wprofiling": PROFILING,
    "wpubfault": PUBFAULT,
    "wfault": FAULT,
    "wjob": JOB,
    "wconfig": CONFIG,
}
