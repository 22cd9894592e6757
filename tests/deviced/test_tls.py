"""deviced reports to a clusterd that requires mTLS and a bearer token."""

from __future__ import annotations

import asyncio

from pki import make_pki
from support import ClusterdProcess

from deviced.app import DeviceD, build_parser
from deviced.backends import SimBackend


async def test_faults_over_mtls_with_token(tmp_path):
    pki = make_pki(tmp_path)
    (tmp_path / "token").write_text("t0ken\n")
    cd = ClusterdProcess(
        tmp_path / "state",
        ["--tls-cert", str(pki["server.crt"]), "--tls-key", str(pki["server.key"]), "--tls-ca", str(pki["ca"]),
         "--token-file", str(tmp_path / "token")],
    )  # fmt: skip
    await asyncio.to_thread(cd.start)
    port = cd.grpc.rsplit(":", 1)[1]
    sim = SimBackend(1, 2)
    args = build_parser().parse_args(
        ["--node-name", "tls-node", "--backend", "sim", "--clusterd", f"localhost:{port}", "--probe-interval", "0",
         "--clusterd-tls-ca", str(pki["ca"]), "--clusterd-tls-cert", str(pki["client.crt"]),
         "--clusterd-tls-key", str(pki["client.key"]), "--clusterd-token-file", str(tmp_path / "token")]
    )  # fmt: skip
    app = DeviceD(args, sim)
    await app.start()
    try:
        await asyncio.wait_for(app.agent.connected.wait(), 15)
        sim.inject(1, 0x80E18008, 1)
        for _ in range(100):
            faults = await asyncio.to_thread(cd.get_json, "/v1/faults")
            if any(f["node"] == "tls-node" and f["code"] == "80E18008" for f in faults):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"fault not in clusterd: {faults}")
    finally:
        await app.stop()
        await asyncio.to_thread(cd.stop)
