"""`--workers N`: what any worker's /metrics says about the load all of them carry."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, values
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.values import MultiProcessValue

from gateway.app import MULTIPROC_ENV, Gateway, build_app
from gateway.config import parse_settings

ENDPOINT = "http://127.0.0.1:9/v1"


def _worker(pid: int, monkeypatch: pytest.MonkeyPatch, inflight: int) -> Gateway:
    """A gateway built as worker `pid` would build it (built, never started), carrying
    `inflight` requests on the cheap tier's endpoint."""
    worker_values = MultiProcessValue(lambda: pid)  # type: ignore[no-untyped-call]
    monkeypatch.setattr(values, "ValueClass", worker_values)
    settings = parse_settings(
        {
            "model": "m",
            "tiers": [
                {"name": "low", "precision": "nvfp4", "endpoints": [ENDPOINT]},
                {"name": "top", "precision": "bf16", "endpoints": ["http://127.0.0.1:10/v1"]},
            ],
            "tenants": [{"name": "t", "api_keys": ["k"]}],
        }
    )
    gateway = build_app(settings, registry=CollectorRegistry(), environ={})
    gateway.runtime.tiers[0].endpoints[0].inflight = inflight
    gateway.exposition()  # a scrape (or the timer) as this worker: it writes its load
    return gateway


def _samples(exposition: bytes, name: str) -> list[float]:
    return [
        sample.value
        for family in text_string_to_metric_families(exposition.decode())
        for sample in family.samples
        if sample.name == name
        and sample.labels.get("endpoint", ENDPOINT) == ENDPOINT
        and sample.labels["tier"] == "low"
    ]


def test_in_flight_requests_are_summed_over_the_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    first = _worker(101, monkeypatch, inflight=3)
    _worker(102, monkeypatch, inflight=7)
    text, _ = first.exposition()
    # One series, whichever worker answers: both workers' requests.
    assert _samples(text, "tiergate_inflight_requests") == [10.0]
    assert _samples(text, "tiergate_queue_depth") == [0.0]
