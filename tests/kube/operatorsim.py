"""A stand-in for the Ascend Operator's and Volcano's hot switch side (issue 32 item 3), played after
the reference's ascend-operator ``onPodUpdateFunc`` / ``handleHotSwitch`` / ``handleOldPodDeleted``
and Volcano's ``needVolcanoOpe=delete``, against the Kubernetes emulator:

- a pod annotated ``needOperatorOpe=create`` gets a backup pod (same template and rank index, on
  ``backup_node``, annotated ``podType=backup`` and ``backupSourcePodName``), Running; the source
  pod is annotated ``backupNewPodName``;
- a pod annotated ``needVolcanoOpe=delete`` is deleted; its backup pod then loses ``podType`` and
  ``backupSourcePodName`` (it becomes the job's pod of that rank);
- a pod annotated ``needOperatorOpe=delete`` is deleted.

It only reacts to annotations: ClusterD that never writes them gets no backup pod.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json

from kube.kubekit import job_pod

NS = "train"


class OperatorSim:
    """Polls the namespace's pods (every 50 ms) and reacts as the module docstring says."""

    def __init__(self, api, backup_node: str = "node-3", volcano: bool = True) -> None:
        self.api = api
        self.backup_node = backup_node
        self.volcano = volcano  # False: nobody acts on needVolcanoOpe=delete (Volcano is slow)
        self.seen: dict[str, dict] = {}  # pod name -> annotations when the Operator acted on it
        self.deleted: list[str] = []
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task

    async def _pods(self) -> list[dict]:
        pods, _ = await self.api.list_pods(NS)
        return pods

    async def _delete(self, name: str) -> None:
        await self.api._call("delete pod", self.api.core.delete_namespaced_pod, name, NS)
        self.deleted.append(name)

    async def _run(self) -> None:
        while True:
            for pod in await self._pods():
                meta = pod["metadata"]
                ann = meta.get("annotations") or {}
                name = meta["name"]
                if ann.get("needOperatorOpe") == "create" and "backupNewPodName" not in ann:
                    self.seen[name] = dict(ann)
                    await self._create_backup(pod)
                elif ann.get("needVolcanoOpe") == "delete" and self.volcano:
                    await self._delete(name)
                    backup = ann.get("backupNewPodName")
                    if backup:  # handleOldPodDeleted
                        body = {"metadata": {"annotations": {"podType": None, "backupSourcePodName": None}}}
                        await self.api.patch_pod(NS, backup, body)
                elif ann.get("needOperatorOpe") == "delete":
                    await self._delete(name)
            await asyncio.sleep(0.05)

    async def _create_backup(self, src: dict) -> None:
        meta = src["metadata"]
        ann = meta["annotations"]
        conf = json.loads(ann["ascend.kubectl.kubernetes.io/ascend-910-configuration"])
        devices = [int(d["device_id"]) for d in conf["devices"]]
        name = f"{meta['name']}-backup"
        pod = job_pod(name, self.backup_node, int(ann["hccl/rankIndex"]), devices)
        pod["metadata"]["ownerReferences"] = copy.deepcopy(meta["ownerReferences"])
        pod["metadata"]["annotations"].update({"podType": "backup", "backupSourcePodName": meta["name"]})
        pod["metadata"]["uid"] = f"uid-{name}"
        await self.api._call("create pod", self.api.core.create_namespaced_pod, NS, pod)
        await self.api.patch_pod(NS, meta["name"], {"metadata": {"annotations": {"backupNewPodName": name}}})
