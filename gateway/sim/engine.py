"""A continuous-batching engine whose clock follows the analytic cost model.

Each engine step advances every running sequence by one token, or by 1 + accepted draft
tokens under n-gram speculation, and takes

    t_w(p) * [R(p, B) if speculating] + c_pre(p) * (prompt tokens admitted, minus cache hits)

seconds, times `time_scale`. The running batch is capped at the capacity knee K(p), so
precision shows up as faster steps and room for more sequences, exactly the two channels
of the cost model. Prefix-cache hits come from the same block-hash replay the observer
uses, and draft acceptance from the same n-gram proposer: no second copy of either.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from dataclasses import dataclass, field

from gateway.observer.ngram_replay import NgramProposer
from gateway.observer.prefix_replay import PrefixCacheReplay, salt_key
from gateway.planner.costmodel import CostModel
from gateway.precision import Precision
from gateway.sim import tokenizer
from gateway.sim.histogram import TIME_TO_FIRST_TOKEN_BUCKETS, Histogram, one_two_five_bounds
from gateway.sim.stops import spaced_texts


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """n-gram speculation as vLLM's `--speculative-config` describes it."""

    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4


@dataclass(frozen=True, slots=True)
class EngineConfig:
    precision: Precision
    cost_model: CostModel
    time_scale: float = 1.0
    max_num_seqs: int | None = None  # default: the capacity knee K(p)
    max_model_len: int = 32_768
    speculation: SpecConfig | None = None
    prefix_caching: bool = False
    block_size: int = 16

    @property
    def batch_cap(self) -> int:
        knee = self.cost_model.knee(self.precision)
        return max(1, min(knee, self.max_num_seqs or knee))

    @property
    def kv_capacity_blocks(self) -> int:
        return int(self.cost_model.kv_capacity_tokens(self.precision) // self.block_size)


@dataclass(slots=True, eq=False)
class Sequence:
    """One choice being generated."""

    prompt_ids: list[int]
    answer: list[str]  # pieces, already cut to max_tokens
    finish_reason: str  # the engine's: "stop" or "length"
    stop_reason: str | None = None  # the stop string that ended the answer
    proposer: NgramProposer | None = None  # the context so far, when speculating
    answer_ids: list[int] = field(default_factory=list)
    emitted: int = 0
    taken: int = 0
    cached_tokens: int = 0
    cache_salt: str | None = None  # its prefix-cache namespace (vLLM's cache_salt)
    done: bool = False
    aborted: bool = False
    arrival: float = 0.0
    first_token_at: float | None = None
    group: SequenceGroup | None = None
    # What each answer token adds to the response text ("" past a stop string); by default
    # the pieces joined by spaces.
    texts: list[str] = field(default_factory=list)
    # How each answer token is spelled, before any stop-string cut, when not as its piece
    # after a space (JSON, a call's arguments): the tokens that logprobs name.
    spelled: list[str] | None = None

    def __post_init__(self) -> None:
        if not self.texts:
            self.texts = spaced_texts(self.answer)

    def text(self, start: int, stop: int) -> str:
        """The text that answer tokens start..stop-1 add."""
        return "".join(self.texts[start:stop])

    def spelling(self, start: int, stop: int) -> list[str] | None:
        """How answer tokens start..stop-1 are spelled; None when as their pieces after a
        space."""
        return None if self.spelled is None else self.spelled[start:stop]

    def take(self) -> list[str]:
        """Pieces emitted since the last call."""
        pieces = self.answer[self.taken : self.emitted]
        self.taken = self.emitted
        return pieces


@dataclass(slots=True, eq=False)
class SequenceGroup:
    """The sequences of one request (n choices) and the waiter its handler sleeps on."""

    sequences: list[Sequence]
    waiter: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def done(self) -> bool:
        return all(seq.done for seq in self.sequences)


@dataclass(slots=True)
class EngineCounters:
    """Cumulative counters, exported under vLLM's metric names."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    spec_drafts: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_accepted_per_pos: list[int] = field(default_factory=list)
    finished: dict[str, int] = field(default_factory=dict)
    steps: int = 0
    # Per sequence, as vLLM observes them per child request when n > 1.
    ttft: Histogram = field(default_factory=lambda: Histogram(TIME_TO_FIRST_TOKEN_BUCKETS))
    e2e: Histogram = field(default_factory=Histogram)
    # Per finished sequence, as vLLM observes them (request_prompt_tokens and
    # request_generation_tokens); bounded to max_model_len by the engine.
    prompt_lengths: Histogram = field(default_factory=Histogram)
    output_lengths: Histogram = field(default_factory=Histogram)


class Engine:
    """Schedules sequences in steps timed by the cost model."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        lengths = one_two_five_bounds(config.max_model_len)
        self.counters = EngineCounters(
            prompt_lengths=Histogram(lengths), output_lengths=Histogram(lengths)
        )
        spec = config.speculation
        if spec is not None:
            self.counters.spec_accepted_per_pos = [0] * spec.num_speculative_tokens
        self.prefix_cache = (
            PrefixCacheReplay(config.block_size, config.kv_capacity_blocks)
            if config.prefix_caching
            else None
        )
        model, p = config.cost_model, config.precision
        self._step_s = model.decode_step_seconds(p) * config.time_scale
        self._prefill_s_per_token = model.prefill_seconds_per_token(p) * config.time_scale
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._clock = 0.0

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- requests --------------------------------------------------------------------------
    def submit(self, group: SequenceGroup) -> None:
        now = asyncio.get_running_loop().time()
        for seq in group.sequences:
            seq.group = group
            seq.arrival = now
            spec = self.config.speculation
            if spec is not None:
                seq.proposer = NgramProposer(
                    spec.prompt_lookup_min,
                    spec.prompt_lookup_max,
                    spec.num_speculative_tokens,
                    context=seq.prompt_ids,
                )
            seq.answer_ids = [tokenizer.token_id(piece) for piece in seq.answer]
            self.waiting.append(seq)
        self._wake.set()

    def abort(self, group: SequenceGroup) -> None:
        for seq in group.sequences:
            # Not counted as finished: vLLM's output processor drops a client's abort
            # without finishing its stats.
            if not seq.done:
                seq.aborted = True
                seq.done = True
        self.running = [seq for seq in self.running if not seq.done]
        self.waiting = deque(seq for seq in self.waiting if not seq.done)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def kv_usage(self) -> float:
        cap = self.config.batch_cap
        return min(1.0, len(self.running) / cap)

    # -- the step loop ---------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self.running and not self.waiting:
                self._wake.clear()
                await self._wake.wait()
                self._clock = loop.time()
            prefill_tokens = self._admit()
            step = self._step_s
            spec = self.config.speculation
            if spec is not None and self.running:
                step *= self.config.cost_model.spec_step_inflation(
                    self.config.precision, len(self.running), spec.num_speculative_tokens
                )
            step += prefill_tokens * self._prefill_s_per_token
            self._clock = max(self._clock, loop.time() - 0.05) + step
            delay = self._clock - loop.time()
            # Steps shorter than the event loop's resolution are batched: the clock stays
            # exact on average, tokens arrive in small bursts.
            await asyncio.sleep(delay if delay > 0.001 else 0)
            self._advance(loop.time())

    def _admit(self) -> int:
        prefill = 0
        cap = self.config.batch_cap
        while self.waiting and len(self.running) < cap:
            seq = self.waiting.popleft()
            if seq.done:
                continue
            tokens = len(seq.prompt_ids)
            cached = 0
            if self.prefix_cache is not None:
                cached = self.prefix_cache.lookup_and_insert(
                    seq.prompt_ids, salt_key(seq.cache_salt)
                )
                self.counters.prefix_queries += tokens
                self.counters.prefix_hits += cached
            seq.cached_tokens = cached
            self.counters.prompt_tokens += tokens
            prefill += tokens - cached
            self.running.append(seq)
        return prefill

    def _advance(self, now: float) -> None:
        self.counters.steps += 1
        spec = self.config.speculation
        still_running = []
        woken: set[int] = set()
        for seq in self.running:
            if seq.done:
                continue
            produced = 1
            if spec is not None and seq.emitted:  # the prefill step drafts nothing (vLLM)
                produced += self._speculate(seq, spec)
            remaining = len(seq.answer) - seq.emitted
            produced = min(produced, remaining)
            if produced > 0:
                if seq.proposer is not None:
                    seq.proposer.extend(seq.answer_ids[seq.emitted : seq.emitted + produced])
                seq.emitted += produced
                self.counters.generation_tokens += produced
                if seq.first_token_at is None:
                    seq.first_token_at = now
                    self.counters.ttft.observe(max(0.0, now - seq.arrival))
            if seq.emitted >= len(seq.answer):
                seq.done = True
                if self.prefix_cache is not None:  # vLLM caches the answer's full blocks too
                    self.prefix_cache.cache_generated(
                        seq.prompt_ids, seq.answer_ids, salt_key(seq.cache_salt)
                    )
                self._count_finished(seq, now)
            else:
                still_running.append(seq)
            group = seq.group
            if group is not None and id(group) not in woken:
                woken.add(id(group))
                group.waiter.set()
        self.running = still_running

    def _speculate(self, seq: Sequence, spec: SpecConfig) -> int:
        """Drafts from the context, accepts the prefix that matches the true continuation."""
        assert seq.proposer is not None
        draft = seq.proposer.propose()
        if not draft:
            return 0
        counters = self.counters
        counters.spec_drafts += 1
        counters.spec_draft_tokens += len(draft)
        # Greedy verification: draft[i] is accepted while it equals the token the target
        # produces at that position, i.e. the true continuation answer[emitted + i].
        truth = seq.answer_ids[seq.emitted : seq.emitted + len(draft)]
        accepted = 0
        for position, (token, expected) in enumerate(zip(draft, truth, strict=False)):
            if token != expected:
                break
            accepted += 1
            counters.spec_accepted_per_pos[position] += 1
        counters.spec_accepted_tokens += accepted
        return accepted

    def _count_finished(self, seq: Sequence, now: float) -> None:
        finished = self.counters.finished
        finished[seq.finish_reason] = finished.get(seq.finish_reason, 0) + 1
        self.counters.e2e.observe(max(0.0, now - seq.arrival))
        self.counters.prompt_lengths.observe(len(seq.prompt_ids))
        self.counters.output_lengths.observe(seq.emitted)


__all__ = ["Engine", "EngineConfig", "EngineCounters", "Sequence", "SequenceGroup", "SpecConfig"]
