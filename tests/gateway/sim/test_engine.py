"""The simulator: timing from the cost model, prefix hits, speculation, quality model."""

from __future__ import annotations

import asyncio

import pytest

from gateway.observer.prefix_replay import PrefixCacheReplay
from gateway.planner.costmodel import CostModel
from gateway.precision import Precision
from gateway.sim import quality, textgen, tokenizer
from gateway.sim.engine import Engine, EngineConfig, Sequence, SequenceGroup, SpecConfig


def run_requests(
    config: EngineConfig, prompts: list[list[int]], answer_len: int
) -> tuple[float, Engine]:
    async def main() -> tuple[float, Engine]:
        engine = Engine(config)
        engine.start()
        loop = asyncio.get_running_loop()
        started = loop.time()
        groups = []
        for prompt in prompts:
            group = SequenceGroup([Sequence(prompt, ["w"] * answer_len, "length")])
            engine.submit(group)
            groups.append(group)
        for group in groups:
            while not group.done:
                group.waiter.clear()
                await group.waiter.wait()
        elapsed = loop.time() - started
        await engine.stop()
        return elapsed, engine

    return asyncio.run(main())


async def answered(engine: Engine, prompt: list[int], answer: list[str]) -> None:
    """Submits one sequence to a running engine and waits for its last token."""
    group = SequenceGroup([Sequence(prompt, answer, "length")])
    engine.submit(group)
    while not group.done:
        group.waiter.clear()
        await group.waiter.wait()


def config(precision: Precision, **kwargs: object) -> EngineConfig:
    return EngineConfig(precision=precision, cost_model=CostModel.preset("h200"), **kwargs)  # type: ignore[arg-type]


def test_decode_time_follows_bytes_per_parameter() -> None:
    model = CostModel.preset("h200")
    scale = 40.0  # steps of 55 ms (bf16) and 14 ms (nvfp4): well above timer resolution
    bf16, _ = run_requests(config("bf16", time_scale=scale), [[1, 2, 3]], 20)
    nvfp4, _ = run_requests(config("nvfp4", time_scale=scale), [[1, 2, 3]], 20)
    expected_bf16 = 20 * model.decode_step_seconds("bf16") * scale
    assert bf16 == pytest.approx(expected_bf16, rel=0.25)
    assert bf16 / nvfp4 == pytest.approx(4.0, rel=0.3)


def test_batching_shares_a_step_across_sequences() -> None:
    scale = 40.0
    one, _ = run_requests(config("bf16", time_scale=scale), [[1]], 10)
    eight, engine = run_requests(config("bf16", time_scale=scale), [[i] for i in range(8)], 10)
    assert eight == pytest.approx(one, rel=0.35)  # decode is bandwidth-bound: same step time
    assert engine.counters.generation_tokens == 80


def test_prefix_caching_counts_vllm_style_hits() -> None:
    shared = list(range(64))
    prompts = [shared + [1000 + i] * 5 for i in range(4)]
    _, engine = run_requests(config("bf16", prefix_caching=True), prompts, 2)
    reference = PrefixCacheReplay(16, None)
    expected_hits = sum(reference.lookup_and_insert(p) for p in prompts)
    assert engine.counters.prefix_hits == expected_hits == 3 * 64
    assert engine.counters.prefix_queries == sum(len(p) for p in prompts)


def test_the_next_turn_hits_the_blocks_of_the_previous_answer() -> None:
    """As vLLM, a finished answer's full blocks are cached: a second turn whose prompt holds
    the first prompt and its answer hits them (the observer's replay does the same)."""
    first = list(range(32))  # 2 blocks of 16
    answer = ["w"] * 20  # with the prompt: 51 computed tokens, 3 full blocks

    async def main() -> Engine:
        engine = Engine(config("bf16", prefix_caching=True))
        engine.start()
        for prompt in (first, [*first, *(tokenizer.token_id(p) for p in answer), *range(90, 106)]):
            await answered(engine, prompt, answer)
        await engine.stop()
        return engine

    engine = asyncio.run(main())
    assert engine.counters.prefix_hits == 48  # not 32: the answer completed a third block


def test_speculation_accepts_copied_spans_and_not_fresh_text() -> None:
    spec = SpecConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=4)

    async def tokens_per_step(answer: list[str], prompt: list[str]) -> float:
        engine = Engine(config("bf16", speculation=spec))
        engine.start()
        group = SequenceGroup([Sequence([tokenizer.token_id(p) for p in prompt], answer, "stop")])
        engine.submit(group)
        while not group.done:
            group.waiter.clear()
            await group.waiter.wait()
        await engine.stop()
        return engine.counters.generation_tokens / engine.counters.steps

    prompt = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "the",
        "lazy",
        "dog",
        "while",
        "the",
        "cat",
        "sleeps",
        "on",
        "a",
        "warm",
        "mat",
    ]
    copying = asyncio.run(tokens_per_step(prompt * 3, prompt))
    fresh = asyncio.run(tokens_per_step([f"w{i}" for i in range(40)], prompt))
    assert copying > 2.5
    assert fresh == pytest.approx(1.0, abs=0.05)


def test_quality_model_levels_and_determinism() -> None:
    easy = "hello, please translate good morning"
    hard = "Prove that the algorithm is correct and refactor it. " + "def f(x): return x * 2\n" * 40
    assert quality.difficulty(easy) < quality.difficulty(hard)
    assert quality.difficulty(hard) == quality.difficulty(hard)
    assert not quality.diverges(hard, "bf16")
    for precision in ("nvfp4", "w4a16", "fp8"):
        assert quality.adequate(easy, precision)
    assert quality.diverges(hard, "nvfp4")
    pieces = tokenizer.pieces(hard)
    reference = textgen.answer(hard, pieces, "bf16")
    assert textgen.answer(hard, pieces, "bf16") == reference
    assert textgen.answer(hard, pieces, "nvfp4") != reference
    assert textgen.answer(easy, tokenizer.pieces(easy), "nvfp4") == textgen.answer(
        easy, tokenizer.pieces(easy), "bf16"
    )


def test_divergence_share_grows_as_precision_drops() -> None:
    prompts = [
        f"question {i}: " + "explain the algorithm and prove it " * (i % 30) for i in range(300)
    ]
    share = {
        p: sum(quality.diverges(text, p) for text in prompts) / len(prompts)
        for p in ("bf16", "fp8", "w4a16", "nvfp4")
    }
    assert share["bf16"] == 0.0
    assert share["fp8"] <= share["w4a16"] <= share["nvfp4"]
    assert share["nvfp4"] > 0.1


@pytest.mark.parametrize(
    "prompt",
    [
        "Which one?\nA. red\nB. blue\nC. green\nD. black",
        "Which one?\n\n  (A) red\n\t(B) blue",  # indented, after a blank line
    ],
)
def test_a_multiple_choice_prompt_is_answered_with_a_letter(prompt: str) -> None:
    """The choices are found at any line start, indented or not (the pattern no longer
    lets leading whitespace cross newlines, which made a prompt of newlines quadratic)."""
    answer = textgen.answer(prompt, tokenizer.pieces(prompt), "bf16")
    assert answer[-3:-1] == ["Answer", ":"] and answer[-1] in "ABCD"  # the final answer
    plain = "Which one?\nred or blue"
    assert textgen.answer(plain, tokenizer.pieces(plain), "bf16")[-3:-1] != ["Answer", ":"]


def test_the_prefill_step_drafts_nothing() -> None:
    """In vLLM a request's first token comes from its prefill step, with no draft: a prompt
    whose continuation the proposer would find, answered in one token, makes no draft."""
    spec = SpecConfig(num_speculative_tokens=4, prompt_lookup_min=2, prompt_lookup_max=2)
    prompt = [tokenizer.token_id(word) for word in ["a", "b", "c", "a", "b"]]

    async def drafts(answer: list[str]) -> int:
        engine = Engine(config("bf16", speculation=spec))
        engine.start()
        await answered(engine, prompt, answer)
        await engine.stop()
        return engine.counters.spec_drafts

    assert asyncio.run(drafts(["c"])) == 0
    assert asyncio.run(drafts(["c", "a", "b"])) == 1  # the second token's step drafts "a b"
