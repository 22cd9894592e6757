"""What a BMC login failure says: pyghmi raises IpmiException(None) when the BMC never answers; the
reason must read 'no answer', not 'None' (tryout)."""

from __future__ import annotations

import pyghmi.exceptions as pexc
import pyghmi.ipmi.private.session as psession
import pytest

from noded.bmc.client import BmcClient, BmcUnreachable


@pytest.mark.parametrize(
    "args, reason", [((None,), "no answer"), ((), "no answer"), (("timeout",), "timeout")]
)
def test_a_login_without_an_answer_says_so(monkeypatch, args, reason):
    def session(**kw):
        raise pexc.IpmiException(*args)

    monkeypatch.setattr(psession, "Session", session)
    with pytest.raises(BmcUnreachable) as e:
        BmcClient("127.0.0.1", 1, "u", "p")._login()
    assert str(e.value) == f"login to 127.0.0.1:1 failed: {reason}"
