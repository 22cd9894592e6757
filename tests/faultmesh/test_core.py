"""Shared core: flags > env > YAML config, token buckets, once-per-period logging, levels."""

from __future__ import annotations

import argparse
import logging

import pytest

from faultmesh import config
from faultmesh.levels import NpuLevel, level_health, level_severity, worst_health
from faultmesh.log import RateLimitedLog, kv
from faultmesh.ratelimit import TokenBucket


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--grpc-addr", default="127.0.0.1:8899")
    p.add_argument("--poll-interval", type=float, default=60.0)
    p.add_argument("--kube", action="store_true")
    return p


def test_flag_beats_env_beats_yaml_beats_default(tmp_path, monkeypatch):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grpc-addr: 10.0.0.1:1\npoll_interval: 5\nkube: true\n")
    a = config.parse(parser(), ["--config", str(cfg)])
    assert (a.grpc_addr, a.poll_interval, a.kube) == ("10.0.0.1:1", 5, True)
    monkeypatch.setenv("FAULTMESH_GRPC_ADDR", "10.0.0.2:2")
    monkeypatch.setenv("FAULTMESH_POLL_INTERVAL", "7.5")
    a = config.parse(parser(), ["--config", str(cfg)])
    assert (a.grpc_addr, a.poll_interval) == ("10.0.0.2:2", 7.5)
    a = config.parse(parser(), ["--config", str(cfg), "--grpc-addr", "10.0.0.3:3"])
    assert a.grpc_addr == "10.0.0.3:3"
    monkeypatch.delenv("FAULTMESH_GRPC_ADDR")
    assert config.parse(parser(), []).grpc_addr == "127.0.0.1:8899"


def test_bad_env_value_and_bad_yaml_exit_with_a_message(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAULTMESH_POLL_INTERVAL", "soon")
    with pytest.raises(SystemExit) as e:
        config.parse(parser(), [])
    assert e.value.code == 2 and "poll_interval" in capsys.readouterr().err
    monkeypatch.delenv("FAULTMESH_POLL_INTERVAL")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(SystemExit):
        config.parse(parser(), ["--config", str(bad)])
    assert "must hold a mapping" in capsys.readouterr().err


@pytest.mark.parametrize(
    "yaml_text, expect",
    [
        ("poll_interval: [5]\n", "bad value for poll_interval from env/config: '[5]' (a number expected)"),
        (
            "grpc_addr: {a: 1}\n",
            "bad value for grpc_addr from env/config: \"{'a': 1}\" (a single value expected)",
        ),
        ("poll_interval: true\n", "bad value for poll_interval from env/config: 'True' (a number expected)"),
        ("kube: fasle\n", "bad value for kube from env/config: 'fasle' (use true or false)"),
        ("kube: [1]\n", "bad value for kube from env/config: '[1]' (use true or false)"),
    ],
)
def test_yaml_values_of_the_wrong_shape_are_usage_errors(tmp_path, capsys, yaml_text, expect):
    # a list where a number belongs started clusterd and crashed its stop(); a map crashed the
    # start with a traceback; true became 1; a misspelt false meant false (tryout findings)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml_text)
    with pytest.raises(SystemExit) as e:
        config.parse(parser(), ["--config", str(cfg)])
    assert e.value.code == 2
    assert expect in capsys.readouterr().err


def test_yaml_scalars_reach_string_flags_as_strings_and_bare_off_is_the_choice(tmp_path):
    p = parser()
    p.add_argument("--backend", choices=("sim", "native", "off"), default="sim")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grpc_addr: 8899\nbackend: off\nkube: 'no'\n")
    a = config.parse(p, ["--config", str(cfg)])
    assert (a.grpc_addr, a.backend, a.kube) == ("8899", "off", False)


def test_unknown_config_keys_and_values_that_refuse_every_client_are_usage_errors(tmp_path, capsys):
    """A misspelt YAML key is named (with the flag it resembles), not silently ignored; a count or a
    rate of 0 or less, from a flag, env or the file, is refused at start (tryout findings)."""
    cfg = tmp_path / "c.yaml"
    cfg.write_text("grpc-adr: 10.0.0.1:1\n")
    with pytest.raises(SystemExit) as e:
        config.parse(parser(), ["--config", str(cfg)])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unknown keys: grpc-adr (did you mean grpc-addr?)" in err

    def limits() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="t")
        p.add_argument("--max-connections", type=config.positive_int, default=1024)
        p.add_argument("--unary-qps", type=config.positive_float, default=1000.0)
        p.add_argument("--period", type=config.non_negative_float, default=0.0)
        return p

    for argv in (
        ["--max-connections", "0"],
        ["--unary-qps", "-1"],
        ["--unary-qps", "nan"],
        ["--period", "-1"],
    ):
        with pytest.raises(SystemExit) as e:
            config.parse(limits(), argv)
        assert e.value.code == 2 and "is not a" in capsys.readouterr().err, argv
    cfg.write_text("max-connections: 0\n")  # a YAML int goes through the same check
    with pytest.raises(SystemExit):
        config.parse(limits(), ["--config", str(cfg)])
    assert "positive integer" in capsys.readouterr().err
    a = config.parse(limits(), ["--max-connections", "8", "--unary-qps", "0.5", "--period", "0"])
    assert (a.max_connections, a.unary_qps, a.period) == (8, 0.5, 0.0)
    cfg.write_bytes(b"grpc-addr: \x99\xfe\n")  # a binary or Latin-1 file: usage, not a traceback
    with pytest.raises(SystemExit) as e:
        config.parse(parser(), ["--config", str(cfg)])
    assert e.value.code == 2 and f"cannot read config file {cfg}: not UTF-8 text" in capsys.readouterr().err


def test_token_bucket_burst_then_refill():
    now = [0.0]
    b = TokenBucket(rate=2.0, burst=3.0, clock=lambda: now[0])
    assert [b.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.5  # one token back
    assert b.take() and not b.take()
    now[0] = 100.0  # capped at the burst
    assert sum(b.take() for _ in range(10)) == 3


def test_rate_limited_log_once_per_period_per_reason(caplog):
    now = [0.0]
    rl = RateLimitedLog(logging.getLogger("t"), period_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING):
        assert rl.warning("bad_id", "public fault rejected", code=409)
        assert not rl.warning("bad_id", "public fault rejected")
        assert rl.warning("bad_time", "public fault rejected")
        now[0] = 61
        assert rl.warning("bad_id", "public fault rejected")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "public fault rejected reason=bad_id suppressed=0 code=409"
    assert lines[-1] == "public fault rejected reason=bad_id suppressed=1"


def test_kv_quotes_values_with_spaces():
    assert kv(a=1, b="two words", c="") == 'a=1 b="two words" c=""'


def test_level_precedence_and_health_mapping():
    assert sorted(NpuLevel, key=int)[-1] is NpuLevel.ManuallySeparateNPU
    assert NpuLevel.PreSeparateNPU > NpuLevel.RestartNPU > NpuLevel.FreeRestartNPU
    assert level_health("PreSeparateNPU") == "SubHealthy"
    assert level_health("FreeRestartNPU") == "UnHealthy"
    assert level_health("NotHandleFault") == "Healthy"
    assert worst_health(["Healthy", "SubHealthy"]) == "SubHealthy"
    assert level_severity("SeparateFault") == level_severity("SeparateNPU")
    with pytest.raises(ValueError):
        NpuLevel.parse("Broken")


def test_an_empty_or_binary_secret_file_is_refused_not_taken_as_no_secret(tmp_path):
    """An empty mounted token Secret must not turn authentication off (tryout finding)."""
    from faultmesh.config import BadSecretFile, read_secret

    (tmp_path / "empty").write_text("\n")
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    (tmp_path / "ok").write_text(" s3cret\n")
    with pytest.raises(BadSecretFile, match="is empty"):
        read_secret(str(tmp_path / "empty"))
    with pytest.raises(BadSecretFile, match="not UTF-8"):
        read_secret(str(tmp_path / "bin"))
    assert isinstance(BadSecretFile("x"), OSError)  # every daemon's start refuses it like a missing file
    assert read_secret(str(tmp_path / "ok")) == "s3cret"
    with pytest.raises(BadSecretFile, match=r"cannot read --token-file .*missing: No such file"):
        read_secret(str(tmp_path / "missing"), what="--token-file")  # the message names the flag


def test_rate_limited_log_keeps_its_level_and_counts_what_it_left_out(caplog):
    t = [0.0]
    rl = RateLimitedLog(logging.getLogger("t.rl"), period_s=60, clock=lambda: t[0])
    caplog.set_level(logging.INFO, logger="t.rl")
    assert rl.log(logging.ERROR, "disk", "node state write failed", error="full")
    assert not rl.log(logging.ERROR, "disk", "node state write failed", error="full")
    t[0] = 61.0
    assert rl.log(logging.ERROR, "disk", "node state write failed", error="full")
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.ERROR, "node state write failed reason=disk suppressed=0 error=full"),
        (logging.ERROR, "node state write failed reason=disk suppressed=1 error=full"),
    ]


def test_a_job_of_max_ranks_with_every_rank_field_fits_the_body_limit():
    """The CLI and clusterd advertise ``ranks: at most MAX_RANKS``: a job file that large, every
    rank field set, must be readable by the CLI and clusterd's HTTP API (tryout finding: 60k ranks
    exceeded the old 4 MiB body)."""
    import orjson

    from faultmesh.config import MAX_BODY_BYTES
    from faultmesh.jobspec import MAX_RANKS, parse_jobs_text

    ranks = [
        {
            "rank": i, "node": f"node-{i // 16:05d}", "device": i % 16, "superPodId": i // 768,
            "deviceIp": f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}",
        }
        for i in range(MAX_RANKS)
    ]  # fmt: skip
    text = orjson.dumps({"id": "job-big", "name": "big", "namespace": "default", "ranks": ranks}).decode()
    assert len(text) <= MAX_BODY_BYTES
    (job,) = parse_jobs_text(text)
    assert len(job.ranks) == MAX_RANKS and job.rank_of("node-06249", 15).rank == MAX_RANKS - 1


def test_every_daemon_answers_version(capsys):
    """``clusterd --version`` / ``noded`` / ``deviced`` failed with 'unrecognized arguments' (tryout)."""
    from faultmesh.metrics import version

    p = argparse.ArgumentParser(prog="noded")
    with pytest.raises(SystemExit) as e:
        config.parse(p, ["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"noded {version()}\n"


def test_daemon_help_shows_the_defaults(capsys):
    """A daemon's --help gave no defaults (--agent-stale-after-s, --drain-s; tryout finding)."""
    p = argparse.ArgumentParser(prog="clusterd")
    p.add_argument("--agent-stale-after-s", type=float, default=30.0, help="silent this long is stale (s)")
    p.add_argument("--node-sn", help="the serial number (default: read from the BMC)")
    p.add_argument("--kube", action="store_true", help="Kubernetes mode")
    with pytest.raises(SystemExit):
        config.parse(p, ["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "silent this long is stale (s) (default: 30.0)" in out
    assert "(default: read from the BMC)" in out and "(default: None)" not in out
    assert "Kubernetes mode (default" not in out
