"""Prometheus metrics: a sink for RequestRecords and gauges set by the background tasks.

Label values come only from configuration (tenant and tier names, endpoint URLs, fixed
reason and outcome vocabularies), never from request content, so cardinality is bounded.
The registry is injected; tests pass their own.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from gateway import __version__
from gateway.stats import EndpointSample, Ladder, RequestRecord, TierSample

UNAUTHENTICATED: Final = "_unauthenticated"
NO_TIER: Final = "_none"

_LATENCY_BUCKETS: Final = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0,
)  # fmt: skip
_OVERHEAD_BUCKETS: Final = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
_PROBABILITY_BUCKETS: Final = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)


class GatewayMetrics:
    """Every metric the gateway exports, registered on one injected registry."""

    def __init__(
        self, registry: CollectorRegistry, build_labels: dict[str, str] | None = None
    ) -> None:
        self.registry = registry
        self._pending: dict[tuple[Any, ...], _Aggregate] = {}
        self._children: dict[tuple[Any, ...], Any] = {}
        self.requests = Counter(
            "tiergate_requests",
            "Requests answered, by tenant, serving tier, endpoint kind and HTTP status "
            "(499: the client left before the answer ended, a stream included).",
            ["tenant", "tier", "endpoint", "status"],
            registry=registry,
        )
        self.request_duration = Histogram(
            "tiergate_request_duration_seconds",
            "Time from request arrival to the last byte (for a 499, to the client's "
            "departure), by tenant and serving tier.",
            ["tenant", "tier"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "tiergate_time_to_first_token_seconds",
            "Streams: time from request arrival to the first relayed event (for a Responses "
            "stream, the first after response.created and response.in_progress).",
            ["tenant", "tier"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.overhead = Histogram(
            "tiergate_gateway_overhead_seconds",
            "Gateway time per request excluding time spent waiting on the upstream.",
            ["endpoint"],
            buckets=_OVERHEAD_BUCKETS,
            registry=registry,
        )
        self.probability = Histogram(
            "tiergate_routing_probability",
            "Calibrated probability that the chosen tier is adequate, by tenant and chosen tier.",
            ["tenant", "tier"],
            buckets=_PROBABILITY_BUCKETS,
            registry=registry,
        )
        self.decisions = Counter(
            "tiergate_routing_decisions",
            "Routing decisions by tenant, decided tier and reason.",
            ["tenant", "tier", "reason"],
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "tiergate_prompt_tokens",
            "Prompt tokens reported by upstream usage, by tenant and serving tier.",
            ["tenant", "tier"],
            registry=registry,
        )
        self.completion_tokens = Counter(
            "tiergate_completion_tokens",
            "Completion tokens reported by upstream usage (streams included).",
            ["tenant", "tier"],
            registry=registry,
        )
        self.cost = Counter(
            "tiergate_estimated_cost",
            "Estimated serving cost: tokens x the tier's relative cost (tiers[].cost; by "
            "default bf16/fp16 1, fp8 0.5, 4-bit 0.25), so 16-bit token equivalents.",
            ["tenant", "tier"],
            registry=registry,
        )
        self.savings = Counter(
            "tiergate_estimated_savings",
            "Estimated cost saved against a baseline (top_tier: the best tier the tenant may use; "
            "uniform_floor: the cheapest uniform tier meeting the tenant's floor, what routing "
            "itself saved); negative increments are tracked apart.",
            ["tenant", "baseline"],
            registry=registry,
        )
        self.overspend = Counter(
            "tiergate_estimated_overspend",
            "Estimated cost above a baseline: routed requests served above the baseline tier, "
            "and the shadow replays of routed requests (what checking the router costs).",
            ["tenant", "baseline"],
            registry=registry,
        )
        self.baseline_cost = Counter(
            "tiergate_estimated_baseline_cost",
            "Estimated cost of the routed requests (pinned ones excluded) had the baseline tier "
            "served them all: what savings and overspend are a share of.",
            ["tenant", "baseline"],
            registry=registry,
        )
        self.escalations = Counter(
            "tiergate_escalations",
            "Requests served by a tier other than the decided one, by from, to and reason.",
            ["tenant", "from_tier", "to_tier", "reason"],
            registry=registry,
        )
        self.attempts = Counter(
            "tiergate_upstream_attempts",
            "Upstream attempts by tier, endpoint and outcome.",
            ["tier", "endpoint", "outcome"],
            registry=registry,
        )
        self.stream_errors = Counter(
            "tiergate_stream_errors",
            "Streams that failed after their first byte (ended with an error event).",
            ["tenant", "tier"],
            registry=registry,
        )
        self.unmetered = Counter(
            "tiergate_unmetered_requests",
            "Answers (200, or 499 when the client left) a tier began to serve whose usage "
            "never arrived (a stream cut after its first byte or left by its client, an "
            "engine that reports none): their tokens are in no token, cost or savings counter.",
            ["tenant", "tier"],
            registry=registry,
        )
        self.client_disconnects = Counter(
            "tiergate_client_disconnects",
            "Requests whose client went away before the response completed.",
            ["tenant", "tier"],
            registry=registry,
        )
        self.rejections = Counter(
            "tiergate_rejections",
            "Requests refused before reaching a tier, by tenant and reason (rate_limit_exceeded, "
            "token_limit_exceeded, concurrency_limit_exceeded, tiers_saturated).",
            ["tenant", "reason"],
            registry=registry,
        )
        # -- traffic regime and planner (per tier) ---------------------------------------
        self.regime_concurrency = Gauge(
            "tiergate_regime_concurrency",
            "Observed concurrency C per tier over the rolling window (stat: mean, p50, p95).",
            ["tier", "stat"],
            registry=registry,
            # Each worker sees its share of the traffic: the tier's C is their sum (its mean
            # exactly, its quantiles approximately), over live workers only.
            multiprocess_mode="livesum",
        )
        # Per-worker estimates merge as the largest among live workers (a dead worker's file
        # no longer counts).
        self.regime_prefix_share = Gauge(
            "tiergate_regime_prefix_share",
            "Prefix-share rate rho per tier (source: replay_unbounded, replay_lru, engine); "
            "the last window that measured it.",
            ["tier", "source"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.regime_repetitiveness = Gauge(
            "tiergate_regime_repetitiveness",
            "Repetitiveness r (i.i.d.-equivalent n-gram acceptance at reference precision) "
            "per tier (source: replay, engine); the last window that measured it.",
            ["tier", "source"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.flag_recommended = Gauge(
            "tiergate_flag_recommended",
            "1 when the planner recommends the flag on for the tier "
            "(flag: speculative_decoding, prefix_caching).",
            ["tier", "flag"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.flag_running = Gauge(
            "tiergate_flag_running",
            "1 when the tier runs with the flag on (from config or vllm:cache_config_info).",
            ["tier", "flag"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.flag_drift = Gauge(
            "tiergate_flag_drift",
            "1 when the running flag differs from the recommendation.",
            ["tier", "flag"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.engine_scrapes = Counter(
            "tiergate_engine_scrapes",
            "The observer's scrapes of each engine's /metrics, by tier, endpoint and outcome "
            "(ok; failed: no 200 answer; unparsable: not a Prometheus text page; "
            "no_model: no vLLM gauge for the tier's served model, so the engine-side regime "
            "and the running flags stay unknown).",
            ["tier", "endpoint", "outcome"],
            registry=registry,
        )
        self.expected_cpt = Gauge(
            "tiergate_planner_expected_cost_per_token_seconds",
            "Cost model: GPU-seconds per output token at the recommended and the running "
            "configuration (config: recommended, running).",
            ["tier", "config"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        # -- router calibration and shadow evaluation (per tenant and tier) ---------------
        self.shadow_requests = Counter(
            "tiergate_shadow_requests",
            "Shadow replays on the top tier by tenant, tier and outcome "
            "(labelled, skipped_saturated, skipped_budget, skipped_queue_full, "
            "skipped_tier_not_allowed, skipped_echo, skipped_choices, skipped_ladder_changed, "
            "failed, not_deterministic).",
            ["tenant", "tier", "outcome"],
            registry=registry,
        )
        self.shadow_labels = Counter(
            "tiergate_shadow_labels",
            "Adequacy labels from shadow evaluation by tenant, tier and verdict.",
            ["tenant", "tier", "adequate"],
            registry=registry,
        )
        # Sums rather than means, so that Prometheus can add workers and replicas up: the
        # window gauges below are one process's view, and two maxima may come from two.
        self.shadow_predicted = Counter(
            "tiergate_shadow_predicted_adequacy",
            "Sum of the predicted P(adequate) of shadow-labelled requests that had one; over "
            "tiergate_shadow_scored_labels_total it is their mean predicted adequacy.",
            ["tenant", "tier"],
            registry=registry,
        )
        self.shadow_scored = Counter(
            "tiergate_shadow_scored_labels",
            "Shadow labels of requests that had a predicted P(adequate), by verdict.",
            ["tenant", "tier", "adequate"],
            registry=registry,
        )
        self.calibration_predicted = Gauge(
            "tiergate_calibration_predicted_adequacy",
            "Mean predicted P(adequate) of shadow-labelled requests over the recent window.",
            ["tenant", "tier"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.calibration_observed = Gauge(
            "tiergate_calibration_observed_adequacy",
            "Observed adequacy (shadow agreement with the top tier) over the recent window.",
            ["tenant", "tier"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.calibration_ece = Gauge(
            "tiergate_calibration_ece",
            "Expected calibration error of the tier's probabilities on recent shadow labels "
            "(once shadow.min_labels of them had a prediction).",
            ["tenant", "tier"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.calibration_drift = Gauge(
            "tiergate_calibration_drift",
            "1 when observed adequacy falls below predicted by more than the alarm margin.",
            ["tenant", "tier"],
            registry=registry,
            multiprocess_mode="livemax",
        )
        self.shadow_cost = Counter(
            "tiergate_shadow_cost",
            "Estimated cost of shadow replays (on the top tier, or a cheaper tier when "
            "exploring), by tenant; the replays of routed requests also count as overspend "
            "against every baseline (what checking the router costs), pinned ones do not.",
            ["tenant"],
            registry=registry,
        )
        self.recalibrations = Counter(
            "tiergate_recalibrations",
            "Online recalibrations swapped in, by tenant.",
            ["tenant"],
            registry=registry,
        )
        # A gauge rather than an Info: Info metrics do not work in multiprocess mode.
        labels = {"version": __version__, **(build_labels or {})}
        self.build_info = Gauge(
            "tiergate_build_info",
            "Version and router build (mypyc or python) of the running gateway (value 1).",
            list(labels),
            registry=registry,
            multiprocess_mode="max",
        )
        self.build_info.labels(*labels.values()).set(1)
        # Baseline tier per tenant, by name: a record keeps the ladder it was served under,
        # and after a reload that changes the ladder an index would point at another tier.
        # For the uniform_floor savings: set by the router (alpha).
        self.uniform_floor_tier: dict[str, str] = {}
        # For the top_tier savings: the best tier the tenant may use.
        self.tenant_top_tier: dict[str, str] = {}

    def forget_removed(self, tiers: Collection[str], tenants: Collection[str]) -> None:
        """Takes the gauges of tiers and tenants a reload removed out of /metrics: a gauge
        keeps its last value for good, so a removed tier's calibration ECE would keep its
        alert firing."""
        per_tier = (
            self.regime_concurrency,
            self.regime_prefix_share,
            self.regime_repetitiveness,
            self.flag_recommended,
            self.flag_running,
            self.flag_drift,
            self.expected_cpt,
            self.calibration_predicted,
            self.calibration_observed,
            self.calibration_ece,
            self.calibration_drift,
        )
        for gauge in per_tier:
            for family in gauge.collect():
                for sample in family.samples:
                    labels = sample.labels
                    tenant = labels.get("tenant")
                    if labels["tier"] in tiers and (tenant is None or tenant in tenants):
                        continue
                    self.drop_series(gauge, labels)

    @staticmethod
    def drop_series(gauge: Gauge, labels: dict[str, str]) -> None:
        """Takes one gauge series out of /metrics (a gauge keeps its last value for good).
        Under --workers a series stays in the files once written: it reads 0."""
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            gauge.labels(**labels).set(0)
        else:
            gauge.remove_by_labels(labels)

    def _child(self, metric: Any, *labels: str) -> Any:
        # Cache labelled children: `.labels()` validates and hashes on every call.
        key = (id(metric), *labels)
        child = self._children.get(key)
        if child is None:
            child = metric.labels(*labels)
            self._children[key] = child
        return child

    # -- the request path: one dict update per request, expanded at flush ------------------
    def record(self, record: RequestRecord) -> None:
        """Sinks one finished request: requests with the same labels share one aggregate."""
        key = (
            record.tenant,
            record.kind,
            record.status,
            record.served_tier,
            record.decided_tier,
            record.reason,
            record.rejected,
            record.ladder,
            tuple(record.attempts),
            record.error_after_first_byte,
            record.client_disconnected,
        )
        aggregate = self._pending.get(key)
        if aggregate is None:
            aggregate = self._pending[key] = _Aggregate(self)
        aggregate.add(record)

    def flush(self) -> None:
        """Moves the accumulated requests into the Prometheus objects (scrape, or timer).

        The locked, per-label work of prometheus_client is paid once per distinct label set
        per flush, not once per request.
        """
        pending, self._pending = self._pending, {}
        counts: dict[tuple[Any, tuple[str, ...]], float] = {}

        def add(metric: Any, labels: tuple[str, ...], amount: float) -> None:
            counts[(metric, labels)] = counts.get((metric, labels), 0.0) + amount

        for key, aggregate in pending.items():
            self._expand(key, aggregate, add)
        for (metric, labels), amount in counts.items():
            self._child(metric, *labels).inc(amount)

    def _expand(self, key: tuple[Any, ...], agg: _Aggregate, add: Callable[..., None]) -> None:
        tenant, kind, status, served, decided_at, reason, rejected, ladder, attempts = key[:9]
        error_after_first_byte, client_disconnected = key[9:]
        names, costs = ladder.names, ladder.costs
        n = agg.count
        tier = NO_TIER if served is None else names[served]
        add(self.requests, (tenant, tier, kind, str(status)), n)
        agg.duration.flush_into(self._child(self.request_duration, tenant, tier))
        agg.overhead.flush_into(self._child(self.overhead, kind))
        if rejected is not None:
            add(self.rejections, (tenant, rejected), n)
        for attempt in attempts:
            add(self.attempts, (names[attempt.tier], attempt.endpoint, attempt.outcome), n)
        if decided_at is not None:
            decided = names[decided_at]
            add(self.decisions, (tenant, decided, reason or "unknown"), n)
            if agg.probability.count:
                agg.probability.flush_into(self._child(self.probability, tenant, decided))
            if served is not None and served != decided_at:
                # Why the decided tier did not serve: its first attempt's outcome, or
                # "unavailable" when none of its endpoints could be tried (health-checked
                # out, circuit open, saturated).
                first = next((a.outcome for a in attempts if a.tier == decided_at), "unavailable")
                add(self.escalations, (tenant, decided, tier, first), n)
        if client_disconnected:  # one left waiting in the gateway has no serving tier
            add(self.client_disconnects, (tenant, tier), n)
        if served is None:
            return
        if agg.ttft.count:
            agg.ttft.flush_into(self._child(self.ttft, tenant, tier))
        if error_after_first_byte:
            add(self.stream_errors, (tenant, tier), n)
        if agg.unmetered:
            add(self.unmetered, (tenant, tier), agg.unmetered)
        tokens = agg.prompt_tokens + agg.completion_tokens
        if tokens:
            add(self.prompt_tokens, (tenant, tier), agg.prompt_tokens)
            add(self.completion_tokens, (tenant, tier), agg.completion_tokens)
            served_cost = tokens * costs[served]
            add(self.cost, (tenant, tier), served_cost)
            if reason != "pinned":  # the client chose the tier: routing saved nothing
                self._credit_savings(add, tenant, tokens, served_cost, ladder)

    def _credit_savings(
        self,
        add: Callable[..., None],
        tenant: str,
        tokens: int,
        served_cost: float,
        ladder: Ladder,
    ) -> None:
        names, costs = ladder.names, ladder.costs
        top, floor = ladder.baselines.get(tenant) or (
            self.tenant_top_tier.get(tenant),
            self.uniform_floor_tier.get(tenant),
        )
        # A baseline tier missing from the record's ladder (served before a reload that
        # added it): the ladder's top for top_tier, and no uniform_floor credit.
        top_cost = costs[names.index(top)] if top in names else costs[-1]
        self._credit(add, tenant, "top_tier", tokens * top_cost, served_cost)
        if floor in names:
            floor_cost = costs[names.index(floor)]
            self._credit(add, tenant, "uniform_floor", tokens * floor_cost, served_cost)

    def record_shadow_cost(self, tenant: str, cost: float, routed: bool = True) -> None:
        """A shadow replay's estimated cost (off the hot path: counted at once). Replays of
        routed requests are what checking the router costs, so routing's savings are net of
        them; a pinned request's replay only collects a label (its tier was the client's
        choice), so it is shadow cost and not routing's overspend."""
        self.shadow_cost.labels(tenant).inc(cost)
        if not routed:
            return
        self.overspend.labels(tenant, "top_tier").inc(cost)
        if self.uniform_floor_tier.get(tenant) is not None:
            self.overspend.labels(tenant, "uniform_floor").inc(cost)

    def _credit(
        self,
        add: Callable[..., None],
        tenant: str,
        baseline: str,
        baseline_cost: float,
        served_cost: float,
    ) -> None:
        # The baseline's own cost over the same requests, so that a share of it leaves out
        # what pinned requests cost (they count in the cost, not in savings).
        add(self.baseline_cost, (tenant, baseline), baseline_cost)
        saved = baseline_cost - served_cost
        if saved >= 0:
            add(self.savings, (tenant, baseline), saved)
        else:
            add(self.overspend, (tenant, baseline), -saved)


class _Aggregate:
    """Requests with identical labels since the last flush: a count, token sums, histograms."""

    __slots__ = (
        "completion_tokens",
        "count",
        "duration",
        "overhead",
        "probability",
        "prompt_tokens",
        "ttft",
        "unmetered",
    )

    def __init__(self, metrics: GatewayMetrics) -> None:
        self.count = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.unmetered = 0  # answers without usage (exported only where a tier served)
        self.duration = _PendingHistogram(metrics.request_duration._upper_bounds)
        self.overhead = _PendingHistogram(metrics.overhead._upper_bounds)
        self.ttft = _PendingHistogram(metrics.ttft._upper_bounds)
        self.probability = _PendingHistogram(metrics.probability._upper_bounds)

    def add(self, record: RequestRecord) -> None:
        self.count += 1
        self.prompt_tokens += record.prompt_tokens
        self.completion_tokens += record.completion_tokens
        if not (record.prompt_tokens or record.completion_tokens) and record.status in (200, 499):
            self.unmetered += 1
        self.duration.observe(record.duration_s)
        self.overhead.observe(record.overhead_s)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        if record.probability is not None:
            self.probability.observe(record.probability)


class _PendingHistogram:
    """Bucket counts and sum of observations not yet flushed into a Histogram child."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: list[float]) -> None:
        self.bounds = bounds
        self.counts = [0] * len(bounds)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        # Prometheus buckets are `le` (value <= bound): bisect_left finds the first such bound.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.total += value

    def flush_into(self, child: Any) -> None:
        # prometheus_client keeps one non-cumulative value per bucket plus a sum (its own
        # `observe` increments exactly these); adding the batch there is equivalent.
        child._sum.inc(self.total)
        for index, count in enumerate(self.counts):
            if count:
                child._buckets[index].inc(count)


class RoutingCollector:
    """Whether routing pays per tenant (tune's verdict), read at scrape time from the running
    policy, so a reload that drops a tenant's alpha (or the tenant) drops its series too."""

    def __init__(self, source: Callable[[], Mapping[str, bool]]) -> None:
        self.source = source

    def collect(self) -> Iterator[Metric]:
        pays = GaugeMetricFamily(
            "tiergate_routing_pays",
            "Per tenant with an alpha: 1 when tuned routing beats the cheapest uniform tier "
            "meeting the floor on validation data, 0 when it does not (thresholds then equal "
            "that tier).",
            labels=["tenant"],
        )
        for tenant, verdict in self.source().items():
            pays.add_metric([tenant], 1.0 if verdict else 0.0)
        yield pays


_INFLIGHT_HELP: Final = "Requests in flight per endpoint."
_QUEUE_HELP: Final = "Requests waiting at the gateway for a tier slot."


class BackendCollector:
    """Endpoint and tier state read at scrape time, so the hot path sets no gauges.

    Without `load`, in-flight and queued requests are left to WorkerLoad (`--workers N`)."""

    def __init__(
        self,
        source: Callable[[], tuple[list[EndpointSample], list[TierSample]]],
        *,
        load: bool = True,
    ) -> None:
        self.source = source
        self.load = load

    def collect(self) -> Iterator[Metric]:
        endpoints, tiers = self.source()
        up = GaugeMetricFamily(
            "tiergate_backend_up",
            "1 when the endpoint passes health checks, else 0.",
            labels=["tier", "endpoint"],
        )
        circuit = GaugeMetricFamily(
            "tiergate_circuit_state",
            "Circuit breaker per endpoint: 0 closed, 1 half-open (its ejection time is over: "
            "the next request is the trial), 2 open (ejected).",
            labels=["tier", "endpoint"],
        )
        inflight = GaugeMetricFamily(
            "tiergate_inflight_requests", _INFLIGHT_HELP, labels=["tier", "endpoint"]
        )
        for sample in endpoints:
            labels = [sample.tier, sample.endpoint]
            up.add_metric(labels, 1.0 if sample.up else 0.0)
            circuit.add_metric(labels, float(sample.circuit_state))
            inflight.add_metric(labels, float(sample.inflight))
        queue = GaugeMetricFamily("tiergate_queue_depth", _QUEUE_HELP, labels=["tier"])
        for tier in tiers:
            queue.add_metric([tier.tier], float(tier.queued))
        yield from (up, circuit)
        if self.load:
            yield from (inflight, queue)


class WorkerLoad:
    """One worker's in-flight and queued requests under `--workers N`, written to the
    multiprocess files so that any worker's /metrics sums them over the live workers: read
    at scrape time, they would be the answering worker's share alone."""

    def __init__(self) -> None:
        self.inflight = Gauge(
            "tiergate_inflight_requests",
            _INFLIGHT_HELP,
            ["tier", "endpoint"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self.queued = Gauge(
            "tiergate_queue_depth",
            _QUEUE_HELP,
            ["tier"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self._published: set[tuple[Gauge, tuple[str, ...]]] = set()

    def publish(self, endpoints: list[EndpointSample], tiers: list[TierSample]) -> None:
        values: dict[tuple[Gauge, tuple[str, ...]], int] = {
            (self.inflight, (s.tier, s.endpoint)): s.inflight for s in endpoints
        }
        values.update({(self.queued, (t.tier,)): t.queued for t in tiers})
        # A series stays in the files once written: one a reload removed reads 0.
        for gone in self._published - values.keys():
            values[gone] = 0
        for (gauge, labels), value in values.items():
            gauge.labels(*labels).set(value)
        self._published = set(values)


__all__ = [
    "NO_TIER",
    "UNAUTHENTICATED",
    "BackendCollector",
    "GatewayMetrics",
    "RoutingCollector",
    "WorkerLoad",
]
