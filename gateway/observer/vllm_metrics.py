"""Typed snapshot of a vLLM `/metrics` page (vLLM 0.33 names, COST_MODEL.md c.2, c.3).

Counters are scraped with a `_total` suffix and summed over the `engine` label (and over
`finished_reason` for request_success). Gauges are averaged over it: a data-parallel server
runs several engines behind one endpoint, each with its own batch and KV cache, and the cost
model's C and K are per engine. Pass `model_name` to keep one served model. A
metric the page does not carry is None: vLLM exports spec-decode counters only with
speculation on, and the planner must tell "absent" from "zero". The prefix-cache counters are
always there, and stay 0 with APC off (rho is then None: no queries).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Final

from prometheus_client.parser import text_string_to_metric_families

__all__ = [
    "CacheConfigInfo",
    "CounterDeltas",
    "VllmMetricsSnapshot",
    "counter_deltas",
    "parse_vllm_metrics",
]

_GAUGES: Final[dict[str, str]] = {
    "num_requests_running": "vllm:num_requests_running",
    "num_requests_waiting": "vllm:num_requests_waiting",
    "kv_cache_usage_perc": "vllm:kv_cache_usage_perc",
}
_COUNTERS: Final[dict[str, str]] = {
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "spec_decode_num_drafts": "vllm:spec_decode_num_drafts_total",
    "spec_decode_num_draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "request_success": "vllm:request_success_total",
    "num_preemptions": "vllm:num_preemptions_total",
    # Histograms of tokens per finished request: their sum and count move together at each
    # finish, while prompt_tokens moves at prefill and generation_tokens at every step.
    "finished_prompt_tokens": "vllm:request_prompt_tokens_sum",
    "finished_output_tokens": "vllm:request_generation_tokens_sum",
    "finished_requests": "vllm:request_prompt_tokens_count",
}
_CACHE_INFO: Final = "vllm:cache_config_info"


def _int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(float(labels[key]))
    except (KeyError, ValueError):
        return None


def _float(labels: Mapping[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return None


def _bool(labels: Mapping[str, str], key: str) -> bool | None:
    value = labels.get(key)
    if value is None:
        return None
    return value.strip().lower() in {"true", "1", "yes"}


@dataclass(frozen=True)
class CacheConfigInfo:
    """Labels of `vllm:cache_config_info` (every CacheConfig field, as strings)."""

    num_gpu_blocks: int | None
    block_size: int | None
    enable_prefix_caching: bool | None
    gpu_memory_utilization: float | None
    cache_dtype: str | None
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfigInfo:
        return cls(
            num_gpu_blocks=_int(labels, "num_gpu_blocks"),
            block_size=_int(labels, "block_size"),
            enable_prefix_caching=_bool(labels, "enable_prefix_caching"),
            gpu_memory_utilization=_float(labels, "gpu_memory_utilization"),
            cache_dtype=labels.get("cache_dtype"),
            labels=dict(labels),
        )

    def knee(self, l_ctx: int) -> int | None:
        """K = num_gpu_blocks * block_size / L_ctx (b.2 item 4)."""
        if self.num_gpu_blocks is None or self.block_size is None or l_ctx <= 0:
            return None
        return self.num_gpu_blocks * self.block_size // l_ctx


@dataclass(frozen=True)
class VllmMetricsSnapshot:
    """Gauges and counters of one scrape; None where the page does not carry the metric."""

    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    kv_cache_usage_perc: float | None = None
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    spec_decode_num_drafts: float | None = None
    spec_decode_num_draft_tokens: float | None = None
    spec_decode_num_accepted_tokens: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    request_success: float | None = None
    num_preemptions: float | None = None
    finished_prompt_tokens: float | None = None
    finished_output_tokens: float | None = None
    finished_requests: float | None = None
    cache_config: CacheConfigInfo | None = None
    engines: int = 1  # data-parallel engines behind the endpoint (`engine` label values)

    @property
    def concurrency(self) -> float | None:
        """running + waiting, the engine-side C."""
        if self.num_requests_running is None:
            return None
        return self.num_requests_running + (self.num_requests_waiting or 0.0)


def parse_vllm_metrics(text: str, model_name: str | None = None) -> VllmMetricsSnapshot:
    """Parses a Prometheus text exposition. Raises ValueError on malformed text."""
    sums: dict[str, float] = {}
    engines: dict[str, set[str]] = {}  # per gauge, the engines that reported it
    cache: CacheConfigInfo | None = None
    gauges = set(_GAUGES.values())
    wanted = gauges | set(_COUNTERS.values())
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == _CACHE_INFO:
                cache = CacheConfigInfo.from_labels(sample.labels)
                continue
            if sample.name not in wanted:
                continue
            if model_name is not None and sample.labels.get("model_name", model_name) != (
                model_name
            ):
                continue
            value = float(sample.value)
            if not math.isfinite(value):  # NaN or Inf carries no count: as if not reported
                continue
            sums[sample.name] = sums.get(sample.name, 0.0) + value
            if sample.name in gauges:
                engines.setdefault(sample.name, set()).add(sample.labels.get("engine", ""))
    for name, seen in engines.items():
        sums[name] /= len(seen)
    values = {attr: sums.get(name) for attr, name in (_GAUGES | _COUNTERS).items()}
    count = max((len(seen) for seen in engines.values()), default=1)
    return VllmMetricsSnapshot(**values, cache_config=cache, engines=count)


@dataclass(frozen=True)
class CounterDeltas:
    """Counter increments between two scrapes, None where either side lacks the counter."""

    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    spec_decode_num_drafts: float | None = None
    spec_decode_num_draft_tokens: float | None = None
    spec_decode_num_accepted_tokens: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    request_success: float | None = None
    num_preemptions: float | None = None
    finished_prompt_tokens: float | None = None
    finished_output_tokens: float | None = None
    finished_requests: float | None = None
    # generation_tokens of the engines whose page carries spec-decode counters: a replica
    # that does not speculate (mid rolling restart) has no rounds to count, and its tokens
    # in the sum would read as rounds without a draft, pulling A_obs, and so r, down.
    spec_generation_tokens: float | None = None

    def __add__(self, other: CounterDeltas) -> CounterDeltas:
        def plus(a: float | None, b: float | None) -> float | None:
            if a is None:
                return b
            return a if b is None else a + b

        return CounterDeltas(
            **{f.name: plus(getattr(self, f.name), getattr(other, f.name)) for f in fields(self)}
        )

    @property
    def rho(self) -> float | None:
        """Engine prefix-cache hit rate in tokens (APC on only)."""
        q, h = self.prefix_cache_queries, self.prefix_cache_hits
        return h / q if q and h is not None else None

    @property
    def tokens_per_round(self) -> float | None:
        """A_obs = generated / (generated - accepted), no-draft rounds included (c.3), over
        the engines that speculate."""
        gen, acc = self.spec_generation_tokens, self.spec_decode_num_accepted_tokens
        if not gen or acc is None or self.spec_decode_num_drafts is None:
            return None
        rounds = gen - acc
        return gen / rounds if rounds > 0 else None

    @property
    def coverage(self) -> float | None:
        """m = drafting rounds / rounds (X8)."""
        gen, acc, drafts = (
            self.spec_generation_tokens,
            self.spec_decode_num_accepted_tokens,
            self.spec_decode_num_drafts,
        )
        if not gen or acc is None or drafts is None or gen - acc <= 0:
            return None
        return drafts / (gen - acc)

    @property
    def l_in(self) -> float | None:
        """Mean prompt length per finished request: from vLLM's per-request histogram where
        the page has it, else prompt tokens over finished requests, which a window edge
        inside a running request skews (its prompt counted, its finish not yet)."""
        if self.finished_requests and self.finished_prompt_tokens is not None:
            return self.finished_prompt_tokens / self.finished_requests
        if not self.request_success or self.prompt_tokens is None:
            return None
        return self.prompt_tokens / self.request_success

    @property
    def l_out(self) -> float | None:
        """Mean output length per finished request, as `l_in`."""
        if self.finished_requests and self.finished_output_tokens is not None:
            return self.finished_output_tokens / self.finished_requests
        if not self.request_success or self.generation_tokens is None:
            return None
        return self.generation_tokens / self.request_success


def _restarted(prev: VllmMetricsSnapshot, cur: VllmMetricsSnapshot) -> bool:
    # Any counter that went down means the engine restarted, and then all its counters
    # restarted from 0: one that has already climbed past its old value must not be diffed.
    for name in _COUNTERS:
        a, b = getattr(prev, name), getattr(cur, name)
        if a is not None and b is not None and b < a:
            return True
    return False


def counter_deltas(prev: VllmMetricsSnapshot, cur: VllmMetricsSnapshot) -> CounterDeltas:
    """cur - prev per counter; after a restart (any counter decreased) cur counts alone."""
    restarted = _restarted(prev, cur)

    def delta(name: str) -> float | None:
        a, b = getattr(prev, name), getattr(cur, name)
        if b is None:
            return None
        if restarted:
            return float(b)
        # Missing from the last scrape only (a partial page, a NaN sample): b is everything
        # the engine counted since it started, not what it counted since then.
        return None if a is None else float(b - a)

    deltas = {name: delta(name) for name in _COUNTERS}
    speculates = deltas["spec_decode_num_drafts"] is not None
    return CounterDeltas(
        **deltas, spec_generation_tokens=deltas["generation_tokens"] if speculates else None
    )
