"""The simulator's /metrics: vLLM's metric names, read from the engine at scrape time.

Counting happens in plain integers inside the engine; this collector only renders them,
so the per-token path never touches prometheus_client.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)

from gateway.sim.engine import Engine
from gateway.sim.histogram import Histogram

# vLLM's FinishReason values (v1/engine/__init__.py), each exported from the start, at 0.
FINISHED_REASONS: Final = ("stop", "length", "abort", "error", "repetition")


class SimCollector:
    """A prometheus_client collector exposing one engine under vLLM's names."""

    def __init__(self, engine: Engine, model_name: str) -> None:
        self.engine = engine
        self.labels = {"engine": "0", "model_name": model_name}

    def collect(self) -> Iterator[Metric]:
        engine, counters, labels = self.engine, self.engine.counters, self.labels
        names, values = list(labels), list(labels.values())

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=names)
            family.add_metric(values, value)
            return family

        yield gauge(
            "vllm:num_requests_running", "Requests in the running batch.", engine.num_running
        )
        yield gauge("vllm:num_requests_waiting", "Requests waiting.", engine.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 0-1.", engine.kv_usage())
        config = engine.config
        info = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Cache configuration.",
            labels=[*names, "block_size", "enable_prefix_caching", "num_gpu_blocks", "cache_dtype"],
        )
        info.add_metric(
            [
                *values,
                str(config.block_size),
                str(config.prefix_caching),
                str(config.kv_capacity_blocks),
                "bfloat16",
            ],
            1.0,
        )
        yield info
        yield counter("vllm:prompt_tokens", "Prefill tokens processed.", counters.prompt_tokens)
        yield counter("vllm:generation_tokens", "Generation tokens.", counters.generation_tokens)
        # The simulator queues above the knee instead of preempting; the counter stays 0.
        yield counter("vllm:num_preemptions", "Preempted requests.", 0)
        # vLLM exports both with prefix caching off too, and never counts them then (0).
        yield counter(
            "vllm:prefix_cache_queries", "Prefix-cache queries (tokens).", counters.prefix_queries
        )
        yield counter("vllm:prefix_cache_hits", "Prefix-cache hits (tokens).", counters.prefix_hits)
        success = CounterMetricFamily(
            "vllm:request_success", "Finished requests.", labels=[*names, "finished_reason"]
        )
        for reason in FINISHED_REASONS:
            success.add_metric([*values, reason], counters.finished.get(reason, 0))
        yield success
        if config.speculation is not None:
            yield counter(
                "vllm:spec_decode_num_drafts", "Rounds with a draft.", counters.spec_drafts
            )
            yield counter(
                "vllm:spec_decode_num_draft_tokens", "Drafted tokens.", counters.spec_draft_tokens
            )
            yield counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Accepted draft tokens.",
                counters.spec_accepted_tokens,
            )
            per_pos = CounterMetricFamily(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted draft tokens per position.",
                labels=[*names, "position"],
            )
            for position, count in enumerate(counters.spec_accepted_per_pos):
                per_pos.add_metric([*values, str(position)], count)
            yield per_pos
        yield counters.e2e.family("vllm:e2e_request_latency_seconds", "End-to-end latency.", labels)
        yield counters.ttft.family(
            "vllm:time_to_first_token_seconds", "Time to first token.", labels
        )
        yield counters.prompt_lengths.family(
            "vllm:request_prompt_tokens", "Prompt tokens per finished request.", labels
        )
        yield counters.output_lengths.family(
            "vllm:request_generation_tokens", "Generated tokens per finished request.", labels
        )


def exposition(collector: SimCollector) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return bytes(generate_latest(registry))


__all__ = ["FINISHED_REASONS", "Histogram", "SimCollector", "exposition"]
