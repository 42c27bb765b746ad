"""The shadow sampler: replays sampled cheaper-tier requests on the top tier, off the
critical path, and turns the comparison into adequacy labels.

On the request path it only decides to capture (a random draw against the tenant's rate)
and, once the client's response is complete, puts the exchange on a bounded queue. Workers
(at most `max_concurrency`) replay it on the top tier unless that tier is saturated or the
shadow budget (a share of the top tier's request slots) is spent, judge the two answers,
and hand the label to the label log, the calibration monitor and the recalibrator.
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
from gateway.backends.tier import TierBackend
from gateway.config import Settings
from gateway.metrics import GatewayMetrics
from gateway.observer.completions import completion_texts
from gateway.shadow.judges import judge
from gateway.shadow.labels import LabelLog
from gateway.shadow.monitor import CalibrationMonitor, Label
from gateway.stats import CompletedExchange

log = logging.getLogger("tiergate.shadow")

_MAX_REPLY_BYTES = 16 * 1024 * 1024


class LabelSink(Protocol):
    """Receives every label (the online recalibrator)."""

    def label(
        self, tenant: str, tier: int, exchange: CompletedExchange, adequate: bool
    ) -> None: ...


def is_deterministic(request: dict[str, Any]) -> bool:
    """Greedy or seeded decoding: the same precision would reproduce the same text."""
    temperature = request.get("temperature")
    return temperature == 0 or request.get("seed") is not None


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
        self._queue: asyncio.Queue[CompletedExchange] | None = None
        self._log: LabelLog | None = None
        self.configure(settings, self.label_log_for(settings))

    def label_log_for(self, settings: Settings) -> LabelLog | None:
        """The label log `settings` ask for: the open one when the path is unchanged, else a
        new one. Raises OSError when it cannot be written, so a reload can still refuse."""
        shadow = settings.shadow
        path = shadow.label_log
        if path is None:
            return None
        if self._log is not None and self._log.path == path:
            return self._log
        return LabelLog(path, shadow.label_log_max_bytes, shadow.label_log_backups)

    def configure(self, settings: Settings, label_log: LabelLog | None) -> None:
        """Applies `settings` with the log `label_log_for` prepared; never raises."""
        shadow = settings.shadow
        self.settings = shadow
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
        self.monitor = getattr(self, "monitor", None) or CalibrationMonitor(
            shadow.window, shadow.drift_margin, shadow.min_labels
        )
        if label_log is not self._log and self._log is not None:
            self._log.close()
        self._log = label_log

    @property
    def enabled(self) -> bool:
        return any(rate > 0 for rate in self.rates.values())

    # -- ExchangeListener: cheap, never raises --------------------------------------------
    def wants_capture(self, tenant: str, tier: int) -> bool:
        rate = self.rates.get(tenant, 0.0)
        if rate <= 0:
            return False
        if tier >= len(self.names) - 1:
            # The top tier's answer is itself the reference: explore a cheaper tier on it.
            explore = self.settings.explore_rate
            return explore > 0 and self.rng() < explore
        return self.rng() < rate

    def upstream_started(self, tier: str, tenant: str) -> None:
        return

    def upstream_finished(self, tier: str, tenant: str) -> None:
        return

    def exchange_done(self, exchange: CompletedExchange) -> None:
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(exchange)
        except asyncio.QueueFull:
            self._count(exchange, "skipped_budget")

    # -- background ------------------------------------------------------------------------
    def start(self) -> list[asyncio.Task[None]]:
        self._queue = asyncio.Queue(self.settings.queue_size)
        loop = asyncio.get_running_loop()
        return [loop.create_task(self._worker()) for _ in range(self.settings.max_concurrency)]

    async def _worker(self) -> None:
        assert self._queue is not None
        while True:
            exchange = await self._queue.get()
            try:
                await self.evaluate(exchange)
            except Exception:  # one bad sample must not stop the worker
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
        if served is None:
            self._count(exchange, "failed")
            return None
        if exchange.tier_index >= top:
            below = int(self.rng() * top)
            candidate = await self._fetch(tiers[below], exchange, below, deterministic)
            if candidate is None:
                return None
            return self._judge(exchange, below, candidate, served, deterministic)
        reference = await self._fetch(tiers[top], exchange, exchange.tier_index, deterministic)
        if reference is None:
            return None
        verdict = self._judge(exchange, exchange.tier_index, served, reference, deterministic)
        explore = self.settings.explore_rate
        if exchange.tier_index > 0 and explore > 0 and self.rng() < explore:
            below = int(self.rng() * exchange.tier_index)
            candidate = await self._fetch(tiers[below], exchange, below, deterministic)
            if candidate is not None:
                self._judge(exchange, below, candidate, reference, deterministic)
        return verdict

    async def _fetch(
        self, target: TierBackend, exchange: CompletedExchange, labelled: int, deterministic: bool
    ) -> str | None:
        """The answer of `target` to the exchange's request; None (counted) when skipped."""
        skip = self._skip_reason(target, deterministic=deterministic)
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

    def _skip_reason(self, target: TierBackend, *, deterministic: bool) -> str | None:
        if not deterministic and not any(
            name in ("choice", "number") for name in self.settings.judges
        ):
            return "not_deterministic"
        if target.saturated or target.queued:
            return "skipped_saturated"  # shadow traffic never competes with a full tier
        capacity = sum(state.max_inflight for state in target.endpoints)
        if self.inflight >= max(1, int(self.settings.budget_share * capacity)):
            return "skipped_budget"
        return None

    async def _replay(self, target: TierBackend, exchange: CompletedExchange) -> str | None:
        endpoint = target.pick()
        if endpoint is None:
            return None
        request = {**exchange.request, "model": target.served_model_name, "stream": False}
        request.pop("stream_options", None)
        path = endpoint.chat_path if exchange.kind == "chat" else endpoint.completions_path
        self.inflight += 1
        endpoint.inflight += 1
        try:
            response = await endpoint.pool.request(
                endpoint.pool.render(b"POST", path, orjson.dumps(request)),
                first_byte_timeout_s=300.0,
                total_timeout_s=600.0,
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
            target.slot_freed()
        if response.status != 200:
            return None
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
            "id": uuid.uuid4().hex,
            "correct": correct,
            "source": f"shadow:{exchange.tenant}",
            "shadow": {
                "tenant": exchange.tenant,
                "at": self.clock(),
                "judge": judge_name,
                "p": predicted,
            },
        }
        request = exchange.request
        if self.keep_text.get(exchange.tenant, False):
            if "messages" in request:
                line["request"] = {"messages": request["messages"]}
            else:
                line["request"] = {"prompt": request.get("prompt")}
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
        metrics.calibration_drift.labels(tenant, tier).set(1 if summary.drift else 0)

    def _count(
        self, exchange: CompletedExchange, outcome: str, labelled: int | None = None
    ) -> None:
        index = exchange.tier_index if labelled is None else labelled
        tier = self.names[index] if index < len(self.names) else exchange.tier
        self.metrics.shadow_requests.labels(exchange.tenant, tier, outcome).inc()

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


__all__ = ["LabelSink", "ShadowSampler", "is_deterministic"]
