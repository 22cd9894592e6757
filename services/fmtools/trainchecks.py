"""What TaskD's manager and MindIO's client would reject or misread in ClusterD's signals: the checks
of trainsim (:mod:`fmtools.trainsim`), the training-side stand-in.

:class:`ClientChecks` reads each payload as TaskD's manager and MindIO's controller use it, and
*fails loudly* (a ``client-error`` event, :attr:`ClientChecks.errors`, and no answer: the real client
would hang or misbehave) where ClusterD sends what they would reject or misread:

- ``preExitProcess`` without faultRanks or nodeRankIds: TaskD stops no worker (its StopWorkers
  messages go to the agents of nodeRankIds); a fault rank on a pod not named is never stopped;
- ``globalFault`` with ``fault_nodes_exit`` / ``fault_nodes_restart``: faultRanks must be set and
  name every rank of the pods in nodeRankIds (MindIO's on_global_rank would treat a rank killed
  with its pod as healthy) — checked when ``ranks_per_pod`` is known; ``fault_nodes_exit`` with no
  nodeRankIds is valid (recover-in-place: every fault pod restarts its processes, no agent exits);
- ``hot-switch`` "hot switch": faultRanks name every rank of the fault pod (MindIO waits for them
  in the backup pod and rebuilds their communication groups; notifyPrepareHotSwitch);
- ``changeStrategy`` with ``fault_nodes_restart``: every pod in nodeRankIds has a fault rank
  (TaskD restarts the workers of those ranks);
- ``changeStrategy``: retry / recover / dump / downgrade / upgrade need faultRanks; recover,
  recover-in-place (restart workers), dump, downgrade and exit need nodeRankIds (TaskD restarts,
  exits or sends ExitAgent only to those pods);
- ``globalFault`` / ``changeStrategy`` must carry the uuid of the flow's stopTrain / saveAndExit
  (a check of ClusterD's own consistency, the reference reusing the flow's uuid: neither client
  passes a uuid on to MindIO; TaskD looks only at preExitProcess uuids).

What reaches MindIO depends on the client the ``role`` stands for (both read for issue "the same
codes, payloads, order and timing"):

- role ``taskd`` (the default): TaskD's Go manager (taskd/go/framework_backend/manager). It turns
  faultRanks into a rank -> type map with Go's ``strconv.Atoi`` (utils GetFaultRanksMapByList): a
  rank whose id or type is not a number is dropped (an error here). Its stop-train plugin
  (plugins/stoptrain/stop_train.go) forwards a ``stopTrain`` only once per signal type + actions
  until it sees a ``globalFault`` or ``changeStrategy`` while it holds the stream token (a
  ``preExitProcess`` releases the token without forgetting); a repeated ``stopTrain`` is dropped,
  and so is a ``preExitProcess`` whose uuid is the last one's. killMaster ends the job, so the next
  TaskD starts afresh. It keeps only the latest ClusterD command and its plugins read it once a
  second: a command followed within that tick (less 0.2 s of jitter) by another, with no answer of
  TaskD's between, may never reach MindIO (an error here). Report answers' codes are ignored (manager.go reportRecoverStatus and the
  others retry only on a gRPC error); ReportRecoverStatus always carries the fault ranks as
  isolateRankIds.
- any other role: the Python gRPC client (taskd/python/toolkit/recover_module/recover_manager.py,
  role "master agent" upstream) that drives MindIO's controller directly. It drops (an error here)
  a signal without actions and one whose jobId is not its own; a rankId or faultType that
  ``int()`` cannot parse raises out of its stream loop, which then subscribes again (Init,
  Register, a new stream: ClusterD resets the flow); it acts only on save_and_exit, stop_train,
  on_global_rank and change_strategy (a signal with none of them is an error here). A report
  answered non-zero is sent once more after a Register; ReportRecoverStatus carries no
  isolateRankIds.

TaskD's Go manager never looks at a signal's jobId (it does not even pass it on); only the Python
client compares it with its own.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

GO_TASKD = "taskd"  # the role of TaskD's Go manager; any other role is the Python client
TASKD_TICK_S = 1.0  # TaskD's manager reads the latest ClusterD command once a second (manager.go Process)
TICK_JITTER_S = 0.2  # arrival jitter allowed on top (two signals sent a tick apart may arrive closer)
MGR_SIGNALS = ("keep-alive", "pauseStartAgent", "continueStartAgent")  # not a ClusterD command
PY_ACTIONS = ("save_and_exit", "stop_train", "on_global_rank", "change_strategy")  # its action_func_map


def go_atoi(s: str) -> int | None:
    """Go's ``strconv.Atoi``: an optional sign, then ASCII digits only; None where it errs."""
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not digits or not all("0" <= c <= "9" for c in digits):
        return None
    return int(s)


class ClientStreamBroken(Exception):
    """The Python client's signal loop raised (``int()`` of a rank): it subscribes again."""


class ClientChecks:
    """The client's view of ClusterD's signals for one job (module docstring), with the state the
    checks need across signals: the flow's uuid, the pods exited at its globalFault, TaskD's
    stop-train plugin and its 1 s tick. ``record(kind, **data)`` receives each ``client-error``
    event. ``ranks_per_pod`` is NPUs per pod (0: unknown, the pod checks are skipped)."""

    def __init__(self, job_id: str, role: str, ranks_per_pod: int, record: Callable[..., None]) -> None:
        self.job_id = job_id
        self.role = role
        self.ranks_per_pod = ranks_per_pod
        self._record = record
        self.errors: list[str] = []  # what the real TaskD / MindIO would reject or misread
        self.flow_uuid = ""  # the uuid of the flow's stopTrain / saveAndExit / hot-switch
        self._exited: set[str] = set()  # pods told to exit at the flow's globalFault (fault_nodes_exit)
        # TaskD's stop-train plugin: holds the stream token, what it forwarded, the last preExit uuid
        self._stop_token, self._stop_sent, self._stop_last_uuid = False, set(), ""
        # TaskD's 1 s tick: when the last ClusterD command came, and whether TaskD answered since
        self.last_cmd: tuple[str, float] | None = None
        self.answered_since = True
        self.taskd_tick_s = TASKD_TICK_S  # 0: the tick check is off (unit tests of other checks)

    def fail(self, sig, why: str) -> bool:
        """Record what the real client would hit; True (the signal is not answered)."""
        self.error(f"{sig.signalType}{' ' + sig.changeStrategy if sig.changeStrategy else ''}: {why}")
        return True

    def error(self, msg: str) -> None:
        """Record ``msg`` as what the real client would hit: in :attr:`errors` and a ``client-error``
        event."""
        self.errors.append(msg)
        self._record("client-error", error=msg)

    def client_drops(self, sig) -> bool:
        """What the client does with ``sig`` before MindIO sees it (module docstring): True when it
        is not answered (an error recorded). Raises :class:`ClientStreamBroken` where the Python
        client's stream loop raises."""
        st, actions = sig.signalType, list(sig.actions)
        if self.role == GO_TASKD:
            if st == "killMaster":  # the job ends: the next TaskD starts with a fresh plugin
                self._stop_token, self._stop_sent, self._stop_last_uuid = False, set(), ""
                return False
            bad = [(f.rankId, f.faultType) for f in sig.faultRanks
                   if go_atoi(f.rankId) is None or go_atoi(f.faultType) is None]  # fmt: skip
            if bad:
                return self.fail(sig, f"faultRanks {bad} are not numbers: TaskD drops them (strconv.Atoi)")
            if not actions:
                return self.fail(sig, "no actions: MindIO's controller acts per action, on none")
            self._check_tick(sig)
            return self._stop_plugin_drops(sig)
        # the Python client, recover_manager.py __signal_pipe_line, in its order
        if st == "killMaster":
            return False
        if not actions:
            return self.fail(sig, "no actions: MindIO's client ignores the signal")
        if sig.jobId != self.job_id:
            return self.fail(sig, f"jobId {sig.jobId!r} is not {self.job_id!r}: MindIO's client discards it")
        try:
            for f in sig.faultRanks:
                int(f.rankId), int(f.faultType)
        except ValueError as e:
            self.fail(sig, f"faultRanks not parsed by int() ({e}): MindIO's client subscribes again")
            raise ClientStreamBroken(str(e)) from None
        if not set(actions) & set(PY_ACTIONS):
            return self.fail(sig, f"actions {actions}: none is registered in MindIO's client")
        return False

    def _check_tick(self, sig) -> None:
        """TaskD's manager keeps only the latest ClusterD command (storage ClusterInfos.Command)
        and its plugins read it once per 1 s tick: a command followed within the tick by another,
        with no answer of TaskD's between (an answer means a tick saw it), may never reach MindIO.
        Records an error then; the signal itself is still answered."""
        if sig.signalType in MGR_SIGNALS:
            return
        now = time.monotonic()
        last, self.last_cmd = self.last_cmd, (sig.signalType, now)
        answered, self.answered_since = self.answered_since, False
        if last is not None and not answered and now - last[1] < self.taskd_tick_s - TICK_JITTER_S:
            msg = (
                f"{sig.signalType} came {now - last[1]:.3f}s after {last[0]} with no answer between:"
                f" TaskD's manager reads one ClusterD command per {self.taskd_tick_s:g}s tick,"
                f" {last[0]} may never reach MindIO"
            )
            self.error(msg)

    def _stop_plugin_drops(self, sig) -> bool:
        """TaskD's stop-train plugin (stop_train.go Predicate, Handle, then PullMsg) on ``sig``:
        True when it drops a ``stopTrain`` or ``preExitProcess`` the flow needs answered."""
        st = sig.signalType
        if not self._stop_token:
            if st == "preExitProcess" and sig.uuid == self._stop_last_uuid:
                return self.fail(sig, "the last preExitProcess's uuid: TaskD's stop-train plugin ignores it")
            if st not in ("stopTrain", "preExitProcess"):
                return False  # not the plugin's: another plugin forwards it
            self._stop_token = True
        if st in ("globalFault", "changeStrategy"):  # release the token, forget what was sent
            self._stop_token = False
            self._stop_sent.clear()
        elif st == "preExitProcess":  # release the token (what was sent is kept), forward
            self._stop_token = False
            self._stop_last_uuid = sig.uuid
            return False
        key = st + json.dumps(list(sig.actions), separators=(",", ":"))  # HasSendMessages' key
        if key in self._stop_sent:
            if st == "stopTrain":
                return self.fail(
                    sig,
                    f"TaskD's stop-train plugin already forwarded {key} and saw no globalFault /"
                    " changeStrategy since: dropped, no ReportStopComplete",
                )
            return False
        self._stop_sent.add(key)
        return False

    def _pods_of(self, ranks) -> set[str]:
        return {str(int(f.rankId) // self.ranks_per_pod) for f in ranks if f.rankId.isdigit()}

    def _left_out(self, ranks, pods) -> list[str]:
        """The ranks of ``pods`` not in ``ranks`` (none checked while ``ranks_per_pod`` is unknown)."""
        named, n = {f.rankId for f in ranks}, self.ranks_per_pod
        return sorted((str(r) for p in pods if p.isdigit() and n for r in range(int(p) * n, (int(p) + 1) * n)
                       if str(r) not in named), key=int)  # fmt: skip

    def rejected(self, sig) -> bool:
        """TaskD's / MindIO's view of ``sig`` (module docstring). True when it is not answered."""
        st, cs, actions = sig.signalType, sig.changeStrategy, set(sig.actions)
        ranks, pods = list(sig.faultRanks), set(sig.nodeRankIds)
        if st in ("stopTrain", "saveAndExit", "hot-switch"):  # each begins a flow (pause too)
            self.flow_uuid, self._exited = sig.uuid, set()
        elif st in ("globalFault", "changeStrategy") and self.flow_uuid and sig.uuid != self.flow_uuid:
            return self.fail(sig, f"uuid {sig.uuid} is not the flow's {self.flow_uuid}")
        if st == "preExitProcess":
            if not ranks or not pods:
                return self.fail(sig, "no faultRanks or nodeRankIds: TaskD stops no worker")
            if self.ranks_per_pod and not self._pods_of(ranks) <= pods:
                return self.fail(sig, f"fault ranks on pods {sorted(self._pods_of(ranks) - pods)} not named")
        exiting = actions & {"fault_nodes_exit", "fault_nodes_restart"}
        if st == "globalFault" and exiting:
            self._exited = pods if "fault_nodes_exit" in exiting else set()
            # fault_nodes_exit with no nodeRankIds is right when every fault pod restarts its
            # processes in place (TaskD exits no agent); MindIO still needs the fault ranks
            if not ranks or ("fault_nodes_restart" in exiting and not pods):
                return self.fail(sig, f"{sorted(exiting)} without nodeRankIds / faultRanks")
            if lost := self._left_out(ranks, pods):
                return self.fail(sig, f"ranks {lost} exit with their pod but are not in faultRanks")
        if st == "faultNodesExit" and (gone := sorted(pods & self._exited, key=lambda p: (len(p), p))):
            return self.fail(sig, f"pods {gone} exited at the globalFault already: TaskD exits them twice")
        if st == "hot-switch" and "hot switch" in actions:  # MindIO waits for every rank of the pod
            if lost := self._left_out(ranks, self._pods_of(ranks)):
                return self.fail(sig, f"ranks {lost} of the switched pod are not in faultRanks")
        if st == "changeStrategy":
            if cs in ("retry", "recover", "dump", "downgrade", "upgrade") and not ranks:
                return self.fail(sig, "empty faultRanks: MindIO recovers no rank")
            if cs in ("recover", "dump", "downgrade", "exit") and not pods:
                what = "restarts no worker" if "fault_nodes_restart" in actions else "exits no agent"
                return self.fail(sig, f"empty nodeRankIds: TaskD {what}")
            if "fault_nodes_restart" in actions and self.ranks_per_pod:
                idle = sorted(pods - self._pods_of(ranks), key=lambda p: (len(p), p))
                if idle:
                    return self.fail(sig, f"pods {idle} restart workers but have no fault rank")
        return False
