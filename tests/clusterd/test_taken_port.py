"""clusterd started on a port something else holds exits at once naming it, and the test launcher
(:class:`support.ClusterdProcess`) moves a first start to free ports (tests run side by side: a free
port can be taken between choosing it and binding it); a restart keeps its ports."""

from __future__ import annotations

import socket

import pytest
from support import ClusterdProcess


@pytest.mark.parametrize("which", ["grpc", "http"])
def test_a_taken_port_ends_clusterd_with_a_clear_line_and_a_first_start_moves_off_it(tmp_path, which):
    cd = ClusterdProcess(tmp_path / "state")
    taken = getattr(cd, which)
    host, port = taken.rsplit(":", 1)
    with socket.socket() as s:
        s.bind((host, int(port)))
        s.listen()
        cd.start()
    try:
        assert getattr(cd, which) != taken and cd.get_json("/v1/faults") == []
        log = cd.log_text()
        assert log.count("clusterd failed to start") == 1, log
        assert "already in use" in log.lower()
        kept = (cd.grpc, cd.http)
        assert cd.stop() == 0
        cd.start()  # a restart: the same addresses (agents hold them)
        assert (cd.grpc, cd.http) == kept and cd.get_json("/v1/faults") == []
    finally:
        cd.stop()
