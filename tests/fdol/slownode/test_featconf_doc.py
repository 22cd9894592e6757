"""docs/slownode.md lists every FeatConf key with the default the code applies (a user reads the
defaults there; a key added or a default changed without the doc fails here)."""

from __future__ import annotations

import re
from pathlib import Path

from fdol.slownode.featconf import _KEYS

DOC = Path(__file__).resolve().parents[3] / "docs" / "slownode.md"


def _shown(default) -> str:
    if isinstance(default, bool):
        return "true" if default else "false"
    return str(default)


def test_every_featconf_key_is_documented_with_its_default():
    rows = dict(re.findall(r"^\| `(\w+)` \| ([^|]+) \|", DOC.read_text(), re.M))
    assert set(rows) == set(_KEYS), set(_KEYS) ^ set(rows)
    for key, (_, _, default) in _KEYS.items():
        if default in (None, "") or key == "rules":  # required, derived, or a word shown in backticks
            continue
        assert rows[key].strip().strip("`") == _shown(default), (key, rows[key], default)


def test_the_reference_payload_holds_the_documented_defaults():
    """reference_featconf (what the demo and the tests enable) is the reference's ConfigMap example
    with every default: parsed, the same FeatConf as the job name alone, but its round period."""
    from fdol.slownode.featconf import REFERENCE_KEYS, parse_featconf, reference_featconf

    got = reference_featconf("j", 0.5, dpLagExcess=0.1)
    assert set(got) == {"jobName", "dpLagExcess", *REFERENCE_KEYS} and got["nSecondsDoOneDetection"] == 0.5
    plain = parse_featconf({"jobName": "j", "nSecondsDoOneDetection": 0.5, "dpLagExcess": 0.1})
    assert parse_featconf(got) == plain
