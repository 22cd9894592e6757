"""Builders of the reference agents' ConfigMaps for the Kubernetes-mode tests."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from faultmesh import gojson


def node_info_cm(info: dict, check: str | None = None, update: str = "2026-01-02T03:04:05+08:00") -> dict:
    code = check if check is not None else gojson.check_code(gojson.canon_node_info(info))
    return {"NodeInfo": json.dumps({"NodeInfo": info, "CheckCode": code}), "updateTime": update}


def device_info_cm(
    device_list: dict, update_time: int = 1767000041, check: str | None = None, **extra
) -> dict:
    inner = {"DeviceList": device_list, "UpdateTime": update_time}
    code = check if check is not None else gojson.check_code(gojson.canon_device_info(inner))
    doc = {"DeviceInfo": inner, "SuperPodID": -2, "ServerIndex": -2, "CheckCode": code, **extra}
    return {"DeviceInfoCfg": json.dumps(doc)}


async def until(pred, timeout_s: float = 10.0, what: str = "condition"):
    """Await ``pred()`` (sync or async) to return a truthy value; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        res = pred()
        if asyncio.iscoroutine(res):
            res = await res
        if res:
            return res
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)
