"""Every metric a doc names (a backticked ``*_total`` / ``*_seconds`` / ``*_bytes``) is one the code
declares: docs/fault-tables.md named noded's level-table counter by its old, unprefixed name
(``noded_level_table_reloads_total``) after issue 17 renamed it (new-user tryout). docs/metrics.md is
left out: its rename table lists the old names on purpose (and ``process_*`` comes from the client)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"`([a-z][a-z0-9_]*_(?:total|seconds|bytes))(?:\{[^`]*\})?`")


def test_metric_names_in_the_docs_exist_in_the_code():
    src = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "services").rglob("*.py"))
    declared = set(re.findall(r"\"(faultmesh_[a-z0-9_]+)\"", src))
    missing = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        if doc.name == "metrics.md":
            continue
        for name in sorted(set(NAME.findall(doc.read_text(encoding="utf-8")))):
            if name not in declared and name.removesuffix("_total") not in declared:
                missing.append(f"{doc.relative_to(ROOT)}: {name}")
    assert not missing, "metric names the code does not declare:\n" + "\n".join(missing)


def test_metrics_doc_lists_every_pubfault_rejection_reason():
    """docs/metrics.md lists every ``reason`` the PubFault intake counts under ``service="pubfault"``,
    and no other (tryout: ``table_rejected`` was missing, and with it the whole list)."""
    src = (ROOT / "services/clusterd/api/pubfault.py").read_text(encoding="utf-8")
    counted = set(re.findall(r'reject\("pubfault", "([a-z_]+)"\)', src))
    counted |= set(re.findall(r'self\._reject\(\s*"([a-z_]+)"', src))
    auth = (ROOT / "services/clusterd/auth.py").read_text(encoding="utf-8")
    if '"/PubFault/SendPublicFault": "pubfault"' in auth:  # the token check counts it as unauthenticated
        counted.add("unauthenticated")
    assert {"rate_or_resource", "table_rejected", "store_error"} <= counted  # the patterns still find them
    doc = (ROOT / "docs/metrics.md").read_text(encoding="utf-8")
    head = '`faultmesh_rejected_requests_total{service="pubfault"}` reasons'
    assert head in doc
    para = doc.split(head, 1)[1].split("\n\n", 1)[0]
    listed = set(re.findall(r"`([a-z_]+)`(?= \()", para))
    assert listed == counted, f"missing: {sorted(counted - listed)}, not counted: {sorted(listed - counted)}"
