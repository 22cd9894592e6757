"""kill -9 under load with storage faults mixed in: nothing acked is lost (issue 19 #1)."""

from __future__ import annotations

import pytest
from chaos.kill9 import run_rounds


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_no_acked_write_is_lost_across_kill9_rounds_with_a_lock_holder(tmp_path):
    tally = run_rounds(tmp_path, rounds=3, load_s=2.5)
    assert tally.rounds == 3
    assert len(tally.acked_public) > 50 and tally.agent_faults_acked > 0
    assert tally.refused_writes > 0, "the lock holder never made a write fail: the test proves nothing"
    assert tally.lost_public == set()
    assert (tally.agent_faults_lost, tally.agent_faults_extra) == (0, 0)
