"""The shadow sampler: replays sampled cheaper-tier requests on the top tier, off the
critical path, and turns the comparison into adequacy labels.

On the request path it only decides to capture (a random draw against the tenant's rate)
and, once the client's response is complete, puts the exchange on a bounded queue. At most
`max_concurrency` evaluations run at once; each replays the request on the top tier unless
that tier is saturated or the shadow budget (a share of the top tier's request slots, for
all replays together) is spent, judges the two answers, and hands the label to the label
log, the calibration monitor and the recalibrator. Replays stay within the tenant's
`allowed_tiers`. The bounds are read from the current settings, so a reload applies them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import orjson

from gateway.backends.h1client import UpstreamFailure
from gateway.backends.tier import TierBackend, served_name
from gateway.config import ConfigError, Settings
from gateway.metrics import GatewayMetrics
from gateway.observer.completions import completion_texts
from gateway.protocol import EndpointKind
from gateway.proxy.rewrite import usage_counts
from gateway.sample_queue import SampleQueue
from gateway.shadow.judges import decides_stochastic, judge
from gateway.shadow.labels import LabelLog, check_label_log_path
from gateway.shadow.monitor import CalibrationMonitor, Label
from gateway.stats import CompletedExchange
from gateway.tenants.registry import allowed_tier_indices

log = logging.getLogger("tiergate.shadow")

_MAX_REPLY_BYTES = 16 * 1024 * 1024
# The request fields the router's features read (router_models/request.py, view_request):
# a label line keeps all of them, so a model trained on the log sees what serving shows it,
# and nothing else (no user ids, no metadata).
FEATURE_FIELDS = (
    "messages",
    "prompt",
    "tools",
    "functions",
    "response_format",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "n",
)


class LabelSink(Protocol):
    """Receives every label (the online recalibrator)."""

    def label(
        self, tenant: str, tier: int, exchange: CompletedExchange, adequate: bool
    ) -> None: ...


def is_deterministic(request: dict[str, Any]) -> bool:
    """Greedy or seeded decoding: the same precision would reproduce the same text."""
    temperature = request.get("temperature")
    return temperature == 0 or request.get("seed") is not None


def as_engine_reads(request: dict[str, Any], kind: EndpointKind) -> dict[str, Any]:
    """The body without the text field its endpoint ignores (a `messages` on completions, a
    `prompt` on chat): a label line describes the request the engine answered, and a model
    trained on it reads the body's own fields (view_request without a kind)."""
    ignored = "prompt" if kind == "chat" else "messages"
    if ignored not in request:
        return request
    return {name: value for name, value in request.items() if name != ignored}


def kept_request(request: dict[str, Any]) -> dict[str, Any]:
    """The part of a request body a label line keeps when the tenant allows text."""
    kept = {field: request[field] for field in FEATURE_FIELDS if field in request}
    if "messages" not in kept and "prompt" not in kept:
        kept["prompt"] = None  # a line always says what it holds
    return kept


def pick_below(limit: int, allowed: frozenset[int], draw: float) -> int | None:
    """A tier below `limit` the tenant may use, chosen by `draw` in [0, 1); None if none."""
    candidates = sorted(index for index in allowed if index < limit)
    if not candidates:
        return None
    return candidates[min(int(draw * len(candidates)), len(candidates) - 1)]


def replay_budget(budget_share: float, top_tier_slots: int) -> int:
    """Replays that may be in flight: a share of the top tier's slots, at least one unless
    the share is 0 (which turns replays off)."""
    if budget_share <= 0:
        return 0
    return max(1, int(budget_share * top_tier_slots))


def skip_reason(
    *,
    deterministic: bool,
    judges: Sequence[str],
    target_busy: bool,
    inflight: int,
    budget: int,
) -> str | None:
    """Why a replay must not run now; None when it may."""
    if not deterministic and not any(decides_stochastic(name) for name in judges):
        return "not_deterministic"  # no configured judge could read the pair
    if target_busy:
        return "skipped_saturated"  # shadow traffic never competes with a full tier
    if inflight >= budget:
        return "skipped_budget"
    return None


def replay_id_header(exchange: CompletedExchange) -> bytes:
    """The replay's x-request-id header: the client's request id, marked, so the engine's logs
    show the replay beside the original, and an abort of one (vLLM aborts by id) never reaches
    the other."""
    if not exchange.request_id:
        return b""
    return b"x-request-id: %s-shadow\r\n" % exchange.request_id.encode()


class ShadowSampler:
    """An ExchangeListener; one per gateway."""

    def __init__(
        self,
        settings: Settings,
        metrics: GatewayMetrics,
        tiers: Callable[[], Sequence[TierBackend]],
        *,
        clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        features: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.metrics = metrics
        self.tiers = tiers
        self.clock = clock
        self.rng = rng
        self.features = features
        self.sinks: list[LabelSink] = []
        self.inflight = 0
        self._queue: SampleQueue[CompletedExchange] | None = None
        self._log: LabelLog | None = None
        shadow = settings.shadow
        self.monitor = CalibrationMonitor(shadow.window, shadow.drift_margin, shadow.min_labels)
        self.configure(settings, self.label_log_for(settings))

    def label_log_for(self, settings: Settings) -> LabelLog | None:
        """The label log `settings` ask for: the open one when the path is unchanged, else a
        new one. Raises ConfigError when it cannot be written, so a reload can still refuse."""
        shadow = settings.shadow
        path = shadow.label_log
        if path is None:
            return None
        if self._log is not None and self._log.path == path:
            return self._log
        try:
            check_label_log_path(path)  # the reasons `tiergate check` gives, in its words
            return LabelLog(path, shadow.label_log_max_bytes, shadow.label_log_backups)
        except OSError as exc:
            # Named, or the refusal read "[Errno 17] File exists: '/etc/x'" with no field.
            raise ConfigError(f"shadow.label_log: {exc}") from None

    def configure(self, settings: Settings, label_log: LabelLog | None) -> None:
        """Applies `settings` with the log `label_log_for` prepared; never raises."""
        shadow = settings.shadow
        self.settings = shadow
        self.timeouts = settings.timeouts
        self.rates = {
            tenant.name: shadow.rate if tenant.shadow_rate is None else tenant.shadow_rate
            for tenant in settings.tenants
        }
        self.keep_text = {
            tenant.name: shadow.keep_text
            if tenant.shadow_keep_text is None
            else tenant.shadow_keep_text
            for tenant in settings.tenants
        }
        self.names = [tier.name for tier in settings.tiers]
        self.allowed = {
            tenant.name: frozenset(allowed_tier_indices(tenant, self.names))
            for tenant in settings.tenants
        }
        # A reload keeps the labels and applies the new bounds (window, margin, min_labels).
        self.monitor.reconfigure(shadow.window, shadow.drift_margin, shadow.min_labels)
        self.monitor.retain(self.rates.keys(), self.names)
        # The new bounds judge the labels held already: the gauges follow now, not at the
        # tier's next label (a tier that gets few kept its drift alert firing).
        for tenant, tier in self.monitor.pairs():
            self._export(tenant, tier)
        if label_log is not self._log and self._log is not None:
            self._log.close()
        if label_log is not None:  # the open log kept by a reload takes the new limits
            label_log.max_bytes = shadow.label_log_max_bytes
            label_log.backups = shadow.label_log_backups
        self._log = label_log

    @property
    def enabled(self) -> bool:
        return any(rate > 0 for rate in self.rates.values())

    # -- ExchangeListener: cheap, never raises --------------------------------------------
    def wants_capture(
        self, tenant: str, tier: int, request: dict[str, Any], kind: EndpointKind
    ) -> bool:
        # A random draw: labels want requests independent of each other, not conversations.
        rate = self.rates.get(tenant, 0.0)
        if rate <= 0 or self.settings.budget_share <= 0:
            return False
        top = len(self.names) - 1
        if tier >= top:
            # The top tier's answer is itself the reference: explore a cheaper tier on it.
            explore = self.settings.explore_rate
            wanted = explore > 0 and self.rng() < explore
        else:
            wanted = self.rng() < rate
        # Capturing what cannot be replayed would only take queue places.
        if wanted and self._unreplayable(tenant, tier):
            self._count_for(tenant, tier, "skipped_tier_not_allowed")
            return False
        return wanted

    def _unreplayable(self, tenant: str, tier: int) -> bool:
        """Whether the tenant's allowed tiers rule a replay of a request served at `tier`
        out: the reference (the top tier) must be allowed, and a top-tier answer needs an
        allowed cheaper tier to explore."""
        top = len(self.names) - 1
        allowed = self.allowed.get(tenant, frozenset(range(top + 1)))
        if top not in allowed:
            return True
        return tier >= top and pick_below(top, allowed, 0.0) is None

    def upstream_started(self, tier: str, tenant: str) -> None:
        return

    def upstream_finished(self, tier: str, tenant: str) -> None:
        return

    def exchange_done(self, exchange: CompletedExchange) -> None:
        if self._queue is None:
            return
        # Bounded here, by the current settings, so that a reload can change the bound.
        if not self._queue.offer(exchange, exchange.size, self.settings.queue_size):
            self._count(exchange, "skipped_queue_full")

    # -- background ------------------------------------------------------------------------
    def start(self) -> list[asyncio.Task[None]]:
        self._queue = SampleQueue()  # exchange_done applies `queue_size`
        return [asyncio.get_running_loop().create_task(self._dispatch(self._queue))]

    async def _dispatch(self, queue: SampleQueue[CompletedExchange]) -> None:
        """Evaluates queued exchanges, at most `max_concurrency` at a time (read before each
        one starts, so a reload applies it); cancelling it cancels them."""
        running: set[asyncio.Task[None]] = set()
        try:
            while True:
                while len(running) >= self.settings.max_concurrency:
                    await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                exchange = await queue.take()
                task = asyncio.create_task(self._evaluate_logged(exchange))
                running.add(task)
                task.add_done_callback(running.discard)
        finally:
            for task in running:
                task.cancel()
            await asyncio.gather(*running, return_exceptions=True)

    async def _evaluate_logged(self, exchange: CompletedExchange) -> None:
        try:
            await self.evaluate(exchange)
        except Exception:  # one bad sample must not stop shadow evaluation
            log.exception("shadow evaluation failed")
            self._count(exchange, "failed")

    async def evaluate(self, exchange: CompletedExchange) -> bool | None:
        """Labels one exchange; returns the verdict for the served (or explored) tier.

        Served by a cheaper tier k: replay on the top tier (the reference) and judge the
        served answer; with probability `explore_rate` also replay on a random tier below k
        and judge that against the same reference. Served by the top tier (captured with
        probability `explore_rate`): replay on a random cheaper tier and judge it against the
        served answer. Exploration keeps labels coming for tiers the router no longer uses
        for such requests.
        """
        tiers = self.tiers()
        top = len(tiers) - 1
        texts = completion_texts(exchange.body)
        served = texts[0] if texts else None
        deterministic = self.settings.assume_deterministic or is_deterministic(exchange.request)
        # Several choices (n > 1, a list of prompts): the judges compare one answer with one
        # reference, and the first choice alone would call a tier adequate whose others differ.
        unlabelable = "skipped_choices" if len(texts) > 1 else self._unlabelable(exchange, served)
        if unlabelable is not None or served is None:
            self._count(exchange, unlabelable or "failed")
            return None
        allowed = self.allowed.get(exchange.tenant, frozenset(range(top + 1)))
        if exchange.tier_index >= top:
            below = pick_below(top, allowed, self.rng())
            assert below is not None  # _unreplayable said there is one
            candidate = await self._fetch(tiers[below], exchange, below, deterministic)
            if candidate is None:
                return None
            return self._judge(exchange, below, candidate, served, deterministic)
        reference = await self._fetch(tiers[top], exchange, exchange.tier_index, deterministic)
        if reference is None:
            return None
        verdict = self._judge(exchange, exchange.tier_index, served, reference, deterministic)
        if self._ladder_moved(exchange):
            return None  # counted by _judge; exploring would replay on the old ladder's tier
        explore = self.settings.explore_rate
        if exchange.tier_index > 0 and explore > 0 and self.rng() < explore:
            below = pick_below(exchange.tier_index, allowed, self.rng())
            if below is not None:
                candidate = await self._fetch(tiers[below], exchange, below, deterministic)
                if candidate is not None:
                    self._judge(exchange, below, candidate, reference, deterministic)
        return verdict

    def _unlabelable(self, exchange: CompletedExchange, served: str | None) -> str | None:
        """Why the exchange cannot be labelled, if it cannot."""
        if exchange.request.get("echo") is True:
            # The answer starts with the prompt (or is only the prompt, when a harness scores
            # it): a judge would read the prompt as the answer, and every tier echoes it.
            return "skipped_echo"
        if served is None:
            return "failed"
        if self._ladder_moved(exchange):
            return "skipped_ladder_changed"
        # Checked again here: a reload may have changed the tenant's tiers since capture.
        if self._unreplayable(exchange.tenant, exchange.tier_index):
            return "skipped_tier_not_allowed"
        return None

    def _ladder_moved(self, exchange: CompletedExchange) -> bool:
        """Whether a reload changed the ladder since capture: the exchange's tier index and
        its probabilities no longer name the same tiers, and a label would go to another (an
        explored tier below it too, renamed or moved, with another tier's prediction)."""
        if exchange.ladder:
            return exchange.ladder != tuple(self.names)
        index = exchange.tier_index
        return index >= len(self.names) or self.names[index] != exchange.tier

    async def _fetch(
        self, target: TierBackend, exchange: CompletedExchange, labelled: int, deterministic: bool
    ) -> str | None:
        """The answer of `target` to the exchange's request; None (counted) when skipped."""
        top_tier_slots = sum(state.max_inflight for state in self.tiers()[-1].endpoints)
        skip = skip_reason(
            deterministic=deterministic,
            judges=self.settings.judges,
            target_busy=target.saturated or bool(target.queued),
            inflight=self.inflight,
            budget=replay_budget(self.settings.budget_share, top_tier_slots),
        )
        text = None if skip else await self._replay(target, exchange)
        if text is None:
            self._count(exchange, skip or "failed", labelled)
        return text

    def _judge(
        self,
        exchange: CompletedExchange,
        labelled: int,
        candidate: str,
        reference: str,
        deterministic: bool,
    ) -> bool | None:
        # Checked again after the replay: a reload may have landed while it was out.
        if self._ladder_moved(exchange):
            self._count(exchange, "skipped_ladder_changed")
            return None
        verdict = judge(
            candidate,
            reference,
            exchange.request,
            self.settings.judges,
            deterministic=deterministic,
        )
        if verdict is None:
            self._count(exchange, "not_deterministic", labelled)
            return None
        self._record(exchange, labelled, verdict.adequate, verdict.judge)
        return verdict.adequate

    async def _replay(self, target: TierBackend, exchange: CompletedExchange) -> str | None:
        endpoint = target.pick()
        if endpoint is None:
            return None
        model = served_name(target, endpoint)
        request = {**exchange.request, "model": model, "stream": False}
        request.pop("stream_options", None)
        if exchange.cache_salt is not None:  # the tenant's namespace, as its own requests
            request["cache_salt"] = exchange.cache_salt
        path = endpoint.paths[exchange.kind]
        self.inflight += 1
        endpoint.inflight += 1
        try:
            response = await endpoint.pool.request(
                endpoint.pool.render(
                    b"POST", path, orjson.dumps(request), replay_id_header(exchange)
                ),
                # The gateway's own limit: a replay waits no longer than a client would. It
                # is a JSON request, whose first byte comes when generation ends, so only
                # total_s applies (first_byte_s would cut the long answers a streamed
                # original was allowed, and the labels would lean towards short ones).
                first_byte_timeout_s=self.timeouts.total_s,
                total_timeout_s=self.timeouts.total_s,
            )
            try:
                body = await response.read(_MAX_REPLY_BYTES)
            finally:
                response.release()
        except UpstreamFailure:
            return None
        finally:
            self.inflight -= 1
            endpoint.inflight -= 1
            endpoint.slot_freed()
        if response.status != 200:
            return None
        counts = usage_counts(body)
        if counts is not None:
            self.metrics.record_shadow_cost(
                exchange.tenant,
                sum(counts) * target.settings.relative_cost,
                routed=exchange.reason != "pinned",
            )
        texts = completion_texts(body)
        return texts[0] if texts else None

    def _record(
        self, exchange: CompletedExchange, labelled: int, adequate: bool, judge_name: str
    ) -> None:
        tier = self.names[labelled]
        self._count(exchange, "labelled", labelled)
        self.metrics.shadow_labels.labels(
            exchange.tenant, tier, "true" if adequate else "false"
        ).inc()
        predicted = None
        if exchange.probabilities is not None:
            predicted = exchange.probabilities[labelled]
        elif exchange.probability is not None and labelled == exchange.tier_index:
            predicted = exchange.probability
        if predicted is not None:
            self.metrics.shadow_predicted.labels(exchange.tenant, tier).inc(predicted)
            self.metrics.shadow_scored.labels(
                exchange.tenant, tier, "true" if adequate else "false"
            ).inc()
        # A reload may have removed the tenant while the exchange waited or replayed: its
        # calibration series are gone, and a label would bring them back for good (and
        # refit a model for a tenant that no longer exists).
        if exchange.tenant in self.rates:
            self.monitor.add(
                exchange.tenant, tier, Label(predicted, exchange.score, adequate, self.clock())
            )
            self._export(exchange.tenant, tier)
            for sink in self.sinks:
                sink.label(exchange.tenant, labelled, exchange, adequate)
        if self._log is not None:
            self._log.append(self._line(exchange, tier, adequate, judge_name, predicted))

    def _line(
        self,
        exchange: CompletedExchange,
        tier: str,
        adequate: bool,
        judge_name: str,
        predicted: float | None,
    ) -> dict[str, Any]:
        # Every tier of the ladder, cheapest first, null where this exchange says nothing:
        # `tiergate router train --data` reads the file as it is.
        correct: dict[str, float | None] = dict.fromkeys(self.names)
        correct[tier] = 1.0 if adequate else 0.0
        correct[self.names[-1]] = 1.0
        line: dict[str, Any] = {
            "id": exchange.request_id or uuid.uuid4().hex,  # the x-request-id clients saw
            "correct": correct,
            "source": f"shadow:{exchange.tenant}",
            "shadow": {
                "tenant": exchange.tenant,
                "at": self.clock(),
                "judge": judge_name,
                "p": predicted,
            },
        }
        request = as_engine_reads(exchange.request, exchange.kind)
        if self.keep_text.get(exchange.tenant, False):
            line["request"] = kept_request(request)
        elif self.features is not None:
            line["features"] = self.features(request)
        return line

    def _export(self, tenant: str, tier: str) -> None:
        summary = self.monitor.summary(tenant, tier)
        metrics = self.metrics
        metrics.calibration_observed.labels(tenant, tier).set(summary.observed)
        if summary.predicted is not None:
            metrics.calibration_predicted.labels(tenant, tier).set(summary.predicted)
        if summary.ece is not None:
            metrics.calibration_ece.labels(tenant, tier).set(summary.ece)
        else:  # fewer labels than min_labels (a reload raised it): no figure, not an old one
            metrics.drop_series(metrics.calibration_ece, {"tenant": tenant, "tier": tier})
        metrics.calibration_drift.labels(tenant, tier).set(1 if summary.drift else 0)

    def _count(
        self, exchange: CompletedExchange, outcome: str, labelled: int | None = None
    ) -> None:
        # Tiers are named as at capture (a reload may have moved them since, also while a
        # replay was out: an old index may now name another tier, or none).
        if labelled is None or labelled == exchange.tier_index:
            tier = exchange.tier
        else:
            tier = (exchange.ladder or self.names)[labelled]
        self.metrics.shadow_requests.labels(exchange.tenant, tier, outcome).inc()

    def _count_for(self, tenant: str, tier: int, outcome: str) -> None:
        """`_count` before there is an exchange (at capture)."""
        if tier < len(self.names):
            self.metrics.shadow_requests.labels(tenant, self.names[tier], outcome).inc()

    def view(self) -> dict[str, Any]:
        """Per tenant and tier: labels, predicted and observed adequacy, ECE, drift."""
        out: dict[str, Any] = {}
        for tenant, tier in self.monitor.pairs():
            summary = self.monitor.summary(tenant, tier)
            out.setdefault(tenant, {})[tier] = {
                "labels": summary.n,
                "predicted": summary.predicted,
                "observed": summary.observed,
                "ece": summary.ece,
                "drift": summary.drift,
            }
        return out

    def close(self) -> None:
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()


__all__ = [
    "FEATURE_FIELDS",
    "LabelSink",
    "ShadowSampler",
    "as_engine_reads",
    "is_deterministic",
    "kept_request",
    "pick_below",
    "replay_budget",
    "replay_id_header",
    "skip_reason",
]
