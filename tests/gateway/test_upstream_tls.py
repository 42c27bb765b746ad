"""https tier endpoints: certificates verified against the tier's CA file (or the system's
store), every upstream call over TLS, a certificate that does not verify a clear 502."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import uvicorn

from gateway.app import check_settings
from gateway.backends.tls import tier_tls_context
from gateway.config import ConfigError, Endpoint, TierSettings, parse_settings
from gateway.planner.costmodel import CostModel
from gateway.sim.engine import EngineConfig
from gateway.sim.server import SimServer
from tests.helpers import API_KEY, MODEL, GatewayThread, fixed_policy, free_port, send

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


class TlsSim:
    """A simulated tier served over https by uvicorn on a background thread."""

    def __init__(self, certfile: Path, keyfile: Path, client_ca: Path | None = None) -> None:
        self.port = free_port()
        self.sim = SimServer(
            EngineConfig(precision="nvfp4", cost_model=CostModel.preset("h200")), "sim-tls"
        )
        config = uvicorn.Config(
            self.sim,
            host="127.0.0.1",
            port=self.port,
            ssl_certfile=str(certfile),
            ssl_keyfile=str(keyfile),
            # With client_ca: mutual TLS, the client must show a certificate it signed.
            ssl_cert_reqs=ssl.CERT_REQUIRED if client_ca else ssl.CERT_NONE,
            ssl_ca_certs=None if client_ca is None else str(client_ca),
            log_level="warning",
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.serve()), daemon=True
        )

    def __enter__(self) -> TlsSim:
        self._thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline and self._thread.is_alive(), "no TLS sim"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(timeout=10)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca, stranger = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("tiergate-gateway")
    files = {
        "ca": folder / "ca.pem",
        "stranger": folder / "stranger.pem",
        "cert": folder / "cert.pem",
        "key": folder / "key.pem",
        "client_cert": folder / "client-cert.pem",
        "client_key": folder / "client-key.pem",
    }
    ca.cert_pem.write_to_path(str(files["ca"]))
    stranger.cert_pem.write_to_path(str(files["stranger"]))
    cert.cert_chain_pems[0].write_to_path(str(files["cert"]))
    cert.private_key_pem.write_to_path(str(files["key"]))
    client.cert_chain_pems[0].write_to_path(str(files["client_cert"]))
    client.private_key_pem.write_to_path(str(files["client_key"]))
    return files


@pytest.fixture(scope="module")
def tls_sim(pki: dict[str, Path]) -> Iterator[TlsSim]:
    with TlsSim(pki["cert"], pki["key"]) as sim:
        yield sim


def tls_settings(sim: TlsSim, admin: dict[str, str] | None = None, **tier: Any) -> Any:
    return parse_settings(
        {
            "model": MODEL,
            # The same engine under its IP and its DNS name: both are in its certificate.
            "tiers": [
                {
                    "name": name,
                    "precision": name,
                    "endpoints": [f"https://{host}:{sim.port}/v1"],
                    "served_model_name": "sim-tls",
                    **tier,
                }
                for name, host in (("nvfp4", "127.0.0.1"), ("bf16", "localhost"))
            ],
            "tenants": [{"name": "default", "api_keys": [API_KEY]}],
            "resilience": {"health_interval_s": 0.2},
            "admin": admin or {},
        }
    )


def test_an_https_tier_is_served_over_verified_tls(tls_sim: TlsSim, pki: dict[str, Path]) -> None:
    before = tls_sim.sim.stats.requests
    settings = tls_settings(tls_sim, tls_ca_file=str(pki["ca"]))
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        reply = send("POST", f"{gw.url}/v1/chat/completions", CHAT)
        assert reply.status == 200, reply.body
        stream = send("POST", f"{gw.url}/v1/chat/completions", {**CHAT, "stream": True})
        assert stream.status == 200 and stream.body.rstrip().endswith(b"data: [DONE]")
        pinned = send(
            "POST", f"{gw.url}/v1/chat/completions", CHAT, headers={"x-tiergate-tier": "bf16"}
        )
        assert pinned.status == 200 and pinned.headers["x-tiergate-tier"] == "bf16"
        assert tls_sim.sim.stats.requests - before == 3
        # Health checks go over TLS too: both endpoints stay healthy.
        time.sleep(0.5)
        assert all(tier.endpoints[0].healthy for tier in gw.app.runtime.tiers)


@pytest.mark.parametrize("ca", ["stranger", None], ids=["another-ca", "system-store"])
def test_a_certificate_that_does_not_verify_is_a_502(
    tls_sim: TlsSim, pki: dict[str, Path], ca: str | None
) -> None:
    extra = {} if ca is None else {"tls_ca_file": str(pki[ca])}
    before = tls_sim.sim.stats.requests
    settings = tls_settings(tls_sim, admin={"token": "adm"}, **extra)
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        reply = send("POST", f"{gw.url}/v1/chat/completions", CHAT)
        assert reply.status in {502, 503}, reply.body  # 503 once health checks took it out
        assert tls_sim.sim.stats.requests == before  # nothing reached the engine
        # The operator sees why: the health check's reason, in the admin view.
        deadline = time.monotonic() + 5
        while True:
            (state,) = send("GET", f"{gw.url}/admin/backends", key="adm").json()["nvfp4"]
            if state["health_error"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert state["healthy"] is False
        assert "certificate verify failed" in state["health_error"].lower()


def test_tls_settings_are_checked(tmp_path: Path) -> None:
    assert Endpoint.parse("https://engine.example/v1").port == 443
    assert Endpoint.parse("http://engine.example/v1").port == 80
    with pytest.raises(ValueError, match="http"):
        Endpoint.parse("ftp://engine.example/v1")
    plain = {"name": "t", "precision": "bf16", "endpoints": ["http://127.0.0.1:9/v1"]}
    with pytest.raises(ValueError, match="https endpoints"):
        TierSettings(**plain, tls_ca_file=tmp_path / "ca.pem")
    missing = parse_settings(
        {
            "model": MODEL,
            "tiers": [
                {
                    "name": name,
                    "precision": name,
                    "endpoints": [f"https://127.0.0.1:{port}/v1"],
                    "tls_ca_file": str(tmp_path / "nowhere.pem"),
                }
                for name, port in (("nvfp4", 9), ("bf16", 10))
            ],
            "tenants": [{"name": "default", "api_keys": [API_KEY]}],
        }
    )
    with pytest.raises(ConfigError, match=r"nowhere\.pem"):
        check_settings(missing, fixed_policy(0), environ={})


def test_a_reload_swaps_the_ca_on_kept_endpoints(tls_sim: TlsSim, pki: dict[str, Path]) -> None:
    settings = tls_settings(tls_sim, tls_ca_file=str(pki["stranger"]))
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status in {502, 503}
        kept = gw.app.runtime.tiers[0].endpoints[0]
        gw.app.reload(tls_settings(tls_sim, tls_ca_file=str(pki["ca"])))
        assert gw.app.runtime.tiers[0].endpoints[0] is kept
        deadline = time.monotonic() + 5
        while not kept.healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200


def test_a_reload_to_a_ca_that_does_not_sign_the_engine_stops_reusing_connections(
    tls_sim: TlsSim, pki: dict[str, Path]
) -> None:
    """Connections verified with the old CA are not reused once a reload changes it (they
    kept serving, and health checks kept the endpoint up); an unchanged CA file keeps the
    same context, so a reload alone does not drop warm connections."""
    settings = tls_settings(tls_sim, tls_ca_file=str(pki["ca"]))
    with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
        assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200
        kept = gw.app.runtime.tiers[0].endpoints[0]
        context = kept.pool.tls
        gw.app.reload(tls_settings(tls_sim, tls_ca_file=str(pki["ca"])))
        assert kept.pool.tls is context  # its connections stay reusable
        before = tls_sim.sim.stats.requests
        gw.app.reload(tls_settings(tls_sim, tls_ca_file=str(pki["stranger"])))
        statuses = [send("POST", f"{gw.url}/v1/chat/completions", CHAT).status for _ in range(3)]
        assert set(statuses) <= {502, 503}, statuses
        assert tls_sim.sim.stats.requests == before
        deadline = time.monotonic() + 5
        while kept.healthy and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not kept.healthy and "certificate verify failed" in (kept.health_error or "")


def test_endpoint_urls_are_read_as_urls(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    tier = TierSettings(
        name="t", precision="bf16", endpoints=["HTTPS://Engine.Example/v1"], tls_ca_file=ca
    )
    assert tier.parsed_endpoints[0].scheme == "https"
    with pytest.raises(ValueError, match="not a valid host name"):
        Endpoint.parse(f"http://{'a' * 64}.example/v1")  # a DNS label holds 63 at most


def test_mutual_tls_shows_the_gateways_certificate(pki: dict[str, Path]) -> None:
    """An engine that asks for a client certificate (mutual TLS) serves the gateway when the
    tier names one, and nothing reaches it when it does not."""
    with TlsSim(pki["cert"], pki["key"], client_ca=pki["ca"]) as mtls:
        client = {"tls_cert_file": str(pki["client_cert"]), "tls_key_file": str(pki["client_key"])}
        settings = tls_settings(mtls, tls_ca_file=str(pki["ca"]), **client)
        with GatewayThread(settings, policy_factory=fixed_policy(0)) as gw:
            assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status == 200
        without = tls_settings(mtls, tls_ca_file=str(pki["ca"]))
        with GatewayThread(without, policy_factory=fixed_policy(0)) as gw:
            assert send("POST", f"{gw.url}/v1/chat/completions", CHAT).status in {502, 503}
        assert mtls.sim.stats.requests == 1


def test_client_certificate_settings_are_checked(pki: dict[str, Path]) -> None:
    https = {"name": "t", "precision": "bf16", "endpoints": ["https://127.0.0.1:9/v1"]}
    with pytest.raises(ValueError, match="tls_key_file needs tls_cert_file"):
        TierSettings(**https, tls_key_file=pki["client_key"])
    plain = {**https, "endpoints": ["http://127.0.0.1:9/v1"]}
    with pytest.raises(ValueError, match="tls_cert_file: for https endpoints"):
        TierSettings(**plain, tls_cert_file=pki["client_cert"])
    mismatched = TierSettings(
        **https, tls_cert_file=pki["client_cert"], tls_key_file=pki["key"]
    )  # the server's key, not the client certificate's
    with pytest.raises(ConfigError, match="TLS file cannot be used"):
        tier_tls_context(mismatched)


def test_a_ca_file_replaced_by_one_of_the_same_mtime_and_size_is_read_again(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    """`cp -p new.pem ca.pem.tmp && mv ca.pem.tmp ca.pem` keeps the mtime; two CAs of one
    key type have PEMs of one size. The context cache keyed on (path, mtime, size) kept
    trusting the old CA."""
    import os
    import shutil

    ca_file = tmp_path / "ca.pem"
    shutil.copy2(pki["ca"], ca_file)
    staged = tmp_path / "ca.pem.tmp"
    shutil.copy2(pki["stranger"], staged)
    before = ca_file.stat()
    os.utime(staged, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert staged.stat().st_size == before.st_size  # trustme's CAs: one size
    settings = TierSettings(
        name="nvfp4",
        precision="nvfp4",
        endpoints=["https://127.0.0.1:9/v1"],
        tls_ca_file=str(ca_file),
    )
    first = tier_tls_context(settings)
    os.replace(staged, ca_file)
    second = tier_tls_context(settings)
    assert first is not None and second is not None and second is not first
