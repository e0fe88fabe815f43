"""bench/rollout.py without servers: nginx discovery and config, nginx's retry log, percentiles."""

from __future__ import annotations

import pathlib

import pytest

from bench import rollout


def test_missing_nginx_names_the_install_command(monkeypatch):
    monkeypatch.setattr(rollout.shutil, "which", lambda name: None)
    monkeypatch.setattr(rollout.os, "access", lambda path, mode: False)
    with pytest.raises(rollout.NginxMissing, match="apt-get install -y nginx"):
        rollout.find_nginx(None)
    assert rollout.main(["--nginx", "/nonexistent/nginx"]) == 2


def test_nginx_config_retries_on_another_replica_for_both_protocols(tmp_path):
    text = rollout.nginx_config(tmp_path, 9000, 9001, [[1, 2, 3], [4, 5, 6]])
    assert "listen 127.0.0.1:9001 http2;" in text and "grpc_pass grpc://replicas_grpc;" in text
    assert text.count("next_upstream error timeout http_502 http_503 non_idempotent;") == 2
    assert "server 127.0.0.1:1 " in text and "server 127.0.0.1:5 " in text  # HTTP and gRPC ports
    assert f"pid {tmp_path}/nginx.pid;" in text and "daemon off;" in text


def test_nginx_retried_counts_requests_sent_to_more_than_one_replica(tmp_path):
    log = tmp_path / "access.log"
    log.write_text("200\n503, 200\n502, 502 : 200\n-\n")
    assert rollout.nginx_retried(log) == {"requests": 2, "after_502": 2, "after_503": 1}
    assert rollout.nginx_retried(pathlib.Path(tmp_path / "none.log")) == {"requests": 0}


def test_percentile_ms():
    assert rollout.percentile_ms([0.001, 0.002, 0.003], 50) == 2.0
    assert rollout.percentile_ms([], 99) is None
