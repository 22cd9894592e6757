"""pingmesh-config validation (reference noded.md §6)."""

from __future__ import annotations

import pytest

from faultmesh.config import load_document
from fdol.slownet import config as c

CM = """
apiVersion: v1
kind: ConfigMap
metadata: {name: pingmesh-config, namespace: cluster-system, labels: {app: pingmesh}}
data:
  global: '{"activate":"on","task_interval":5}'
  "1": '{"activate":"off","task_interval":1}'
  roce: '{"activate":"on","task_interval":1}'
"""


def test_configmap_form_and_super_pod_key_wins():
    cfg = c.parse_config(load_document(CM))  # the services decode the YAML
    assert set(cfg) == {"global", "1", "roce"}  # roce: the RoCE plane's own entry (issue 16)
    assert c.for_super_pod(cfg, "roce") == c.Activation(True, 1)
    assert c.for_super_pod({"global": c.Activation(True, 5)}, "roce") is None  # no global fallback
    assert c.for_super_pod(cfg, 1) == c.Activation(False, 1)
    assert c.for_super_pod(cfg, "0") == c.Activation(True, 5)
    assert c.for_super_pod(cfg, 0).period_s == 50
    assert c.for_super_pod({"1": c.Activation(True, 1)}, 0) is None
    assert c.to_json_obj(cfg)["global"] == {"activate": "on", "task_interval": 5}
    assert c.Activation(True, 1).go_repr() == '&types.HccspingMeshConfig{Activate:"on", TaskInterval:1}'


@pytest.mark.parametrize(
    "data, message",
    [
        ({"global": {"activate": "yes", "task_interval": 1}}, "activate"),
        ({"global": {"activate": "on", "task_interval": 0}}, "task_interval"),
        ({"global": {"activate": "on", "task_interval": 61}}, "task_interval"),
        ({"global": {"activate": "on", "task_interval": True}}, "task_interval"),
        ({"global": {"activate": "on"}}, "task_interval"),
        ({"global": "{not json"}, "not JSON"),
        ({"pod-a": {"activate": "on", "task_interval": 1}}, "neither"),
        ({}, "no 'global'"),
        ("[1, 2]", "mapping"),
        ("a: [", "not JSON"),
        ('{"global": NaN}', "not JSON"),
    ],
)
def test_invalid_config_rejected(data, message):
    with pytest.raises(c.PingmeshConfigError, match=message):
        c.parse_config(data)
