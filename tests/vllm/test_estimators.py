"""The observer's replay estimators against what the real engine measured.

- n-gram speculation (tier `spec`): the observer replays vLLM's proposer over the prompts
  and completions it saw (token ids from the tier's own /tokenize) and reports tokens per
  round A_sim and r_iid = A^-1(A_sim); the engine's counters give A_obs = gen / (gen - acc)
  and 1 + accepted / drafts. The same replay over the exact token ids vLLM returned
  (`return_token_ids`) separates the estimator's error from re-tokenization's.
- prefix caching (tier `prefix`): the block-hash replay's rho against
  prefix_cache_hits / prefix_cache_queries, with the engine's block size (128 on CPU).

The numbers are printed (run with -s), kept for the terminal summary and written to
benchmarks/results/tmp/vllm_tests.json; docs/vllm-tests.md records them.
"""

from __future__ import annotations

import json
import random
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gateway.observer.acceptance import inverse_accepted_per_round
from gateway.observer.ngram_replay import NgramCounts, replay_pair
from tests.vllm.deployment import Deployment, VllmServer
from tests.vllm.support import (
    PUBLIC_MODEL,
    EngineScrape,
    admin_get,
    client,
    observed_gateway,
    post_json,
    settled_scrape,
    wait_for,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

K, MIN_N, MAX_N = 4, 2, 4  # the planner's speculative config for this deployment
WORDS = [
    "def",
    "return",
    "import",
    "class",
    "self",
    "value",
    "index",
    "items",
    "total",
    "print",
    "list",
    "dict",
    "key",
    "data",
    "error",
    "while",
    "yield",
    "lambda",
    "assert",
    "raise",
    "break",
    "none",
    "true",
    "false",
]

# Tolerances the measured data supports (docs/vllm-tests.md has the numbers):
# greedy outputs of the tiny model loop in short cycles, so about 40 % of draft tokens hit.
A_REL_EXACT = 0.03  # replay over vLLM's own token ids vs A_obs
A_REL_OBSERVED = 0.06  # the observer (re-tokenized completions) vs A_obs
R_ABS = 0.05  # r_iid vs r_engine = A^-1(A_obs)
RHO_ABS = 0.005  # block-hash replay vs the engine's hits / queries


def ngram_prompts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(n)]


def record(report: dict[str, Any], key: str, numbers: dict[str, Any]) -> None:
    report.setdefault("agreement", {})[key] = numbers
    print(f"\n[vllm agreement] {key}: {json.dumps(numbers, indent=1, sort_keys=True)}")


def tokenize(server: VllmServer, **query: Any) -> list[int]:
    body = {"model": server.served_model_name, **query}
    return list(post_json(f"{server.url}/tokenize", body)["tokens"])


def test_ngram_replay_matches_the_engines_acceptance(
    deployment: Deployment, vllm_report: dict[str, Any]
) -> None:
    server = deployment["spec"]
    prompts = ngram_prompts(24)
    with observed_gateway(deployment) as gw:
        sdk = client(gw)
        before = EngineScrape.of(server)

        def run(prompt: str) -> tuple[str, list[int], str]:
            completion = sdk.completions.create(
                model=f"{PUBLIC_MODEL}@spec",
                prompt=prompt,
                max_tokens=96,
                temperature=0,
                extra_body={"ignore_eos": True, "return_token_ids": True},
            )
            choice = completion.choices[0]
            return prompt, list(choice.model_extra["token_ids"]), choice.text  # type: ignore[index]

        with ThreadPoolExecutor(3) as pool:
            results = list(pool.map(run, prompts))
        after = settled_scrape(server, before, len(prompts))
        gen = after.delta(before, "vllm:generation_tokens_total")
        acc = after.delta(before, "vllm:spec_decode_num_accepted_tokens_total")
        a_obs = gen / (gen - acc)

        def caught_up() -> dict[str, Any] | None:
            view = admin_get(gw, "/admin/regime")
            tier = view["tiers"]["spec"]
            done = view["samples"]["processed"] >= len(prompts)
            return tier if done and tier["r"]["a_obs"] == pytest.approx(a_obs) else None

        tier = wait_for(caught_up, "the observer to replay every sample and scrape the engine")

    drafts = after.delta(before, "vllm:spec_decode_num_drafts_total")
    draft_tokens = after.delta(before, "vllm:spec_decode_num_draft_tokens_total")
    engine = {
        "A_obs": a_obs,
        "mean_acceptance_length": 1 + acc / drafts,
        "accept_rate": acc / draft_tokens,
        "r_engine": inverse_accepted_per_round(a_obs, K),
        "generated_tokens": gen,
        "drafts": drafts,
        "accepted": acc,
        "rounds": gen - acc,
    }

    exact = NgramCounts()
    retokenized = retokenized_tokens = 0
    for prompt, ids, text in results:
        prompt_ids = tokenize(server, prompt=prompt)
        exact = exact + replay_pair(prompt_ids, ids, MIN_N, MAX_N, K)
        again = tokenize(server, prompt=text, add_special_tokens=False)
        retokenized += again != ids
        retokenized_tokens += len(again)
    summary = exact.summary(K)
    replay = {
        "A_sim": summary["A_sim"],
        "mean_acceptance_length": 1 + exact.accepted_tokens / exact.draft_rounds,
        "accept_rate": summary["accept_rate"],
        "r_iid": summary["r_iid"],
        "drafts": exact.draft_rounds,
        "accepted": exact.accepted_tokens,
        "rounds": exact.rounds,
    }
    observed = {
        "A_sim": tier["r"]["A_sim"],
        "r_iid": tier["r"]["r_iid"],
        "a_obs": tier["r"]["a_obs"],
        "r_engine": tier["r"]["r_engine"],
        "completions_retokenized_differently": f"{retokenized}/{len(results)}",
        "retokenized_tokens_per_generated": retokenized_tokens / gen,
    }
    record(
        vllm_report,
        "ngram",
        {
            "engine": engine,
            "replay_exact_ids": replay,
            "observer": observed,
            "requests": len(prompts),
        },
    )

    assert gen == 24 * 96
    assert observed["a_obs"] == pytest.approx(a_obs)  # the observer reads the same counters
    assert replay["A_sim"] == pytest.approx(a_obs, rel=A_REL_EXACT)
    # The replay's first round is the prefill step, with no draft, as in the engine.
    assert replay["drafts"] == drafts
    assert replay["mean_acceptance_length"] == pytest.approx(
        engine["mean_acceptance_length"], rel=A_REL_OBSERVED
    )
    assert observed["A_sim"] == pytest.approx(a_obs, rel=A_REL_OBSERVED)
    assert observed["r_iid"] == pytest.approx(observed["r_engine"], abs=R_ABS)


def shared_prefix_workload(apps: int = 4, users: int = 4) -> list[list[dict[str, str]]]:
    """Chats of `apps` long system prompts (about 300 to 750 tokens), `users` each, with
    one-off prompts between them; a fresh nonce keeps earlier tests' blocks out of it."""
    rng = random.Random(11)
    nonce = uuid.uuid4().hex
    systems = [
        f"[{nonce} app {a}] " + " ".join(rng.choice(WORDS) for _ in range(150 + 100 * a))
        for a in range(apps)
    ]
    chats = []
    for u in range(users):
        for a, system in enumerate(systems):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
            chats.append(
                [
                    {"role": "system", "content": system},
                    {"role": "user", "content": f"user {u} of app {a}: {question}"},
                ]
            )
        one_off = f"[{nonce} one-off {u}] " + " ".join(rng.choice(WORDS) for _ in range(200))
        chats.append([{"role": "user", "content": one_off}])
    return chats


@pytest.mark.parametrize("planner", ["deployment", "gateway_default"])
def test_prefix_replay_matches_the_engines_hit_rate(
    deployment: Deployment, vllm_report: dict[str, Any], planner: str
) -> None:
    """With the deployment's planner settings the replay hashes 128-token blocks from the
    start; with the gateway's defaults (16-token blocks, GPU presets) the observer must
    adopt the engine's block size from `vllm:cache_config_info` at its first scrape."""
    server = deployment["prefix"]
    chats = shared_prefix_workload()
    overrides = {"planner": {}} if planner == "gateway_default" else {}
    with observed_gateway(deployment, **overrides) as gw:
        sdk = client(gw)
        before = EngineScrape.of(server)
        for messages in chats:  # one at a time: a cached block is reused only once computed
            sdk.chat.completions.create(
                model=f"{PUBLIC_MODEL}@prefix", messages=messages, max_tokens=1, temperature=0
            )
        after = settled_scrape(server, before, len(chats))
        hits = after.delta(before, "vllm:prefix_cache_hits_total")
        queries = after.delta(before, "vllm:prefix_cache_queries_total")

        def caught_up() -> dict[str, Any] | None:
            view = admin_get(gw, "/admin/regime")
            tier = view["tiers"]["prefix"]
            done = view["samples"]["processed"] >= len(chats)
            return tier if done and tier["rho"]["engine"] == pytest.approx(hits / queries) else None

        tier = wait_for(caught_up, "the observer to replay every prompt and scrape the engine")
    rho = tier["rho"]
    numbers = {
        "engine": {"rho": hits / queries, "hits": hits, "queries": queries},
        "observer": {
            "rho_unbounded": rho["unbounded"],
            "rho_lru": rho["lru"],
            "rho_engine": rho["engine"],
            "sampled_tokens": rho["sampled_tokens"],
            "capacity_blocks": rho["capacity_blocks"],
        },
        "block_size": int(EngineScrape.of(server).labels("vllm:cache_config_info")["block_size"]),
        "requests": len(chats),
    }
    record(vllm_report, f"rho_{planner}_planner", numbers)

    # The observer tokenized exactly what the engine prefilled (chat template included).
    assert rho["sampled_tokens"] == queries
    assert rho["engine"] == pytest.approx(hits / queries)
    assert rho["unbounded"] == pytest.approx(hits / queries, abs=RHO_ABS)
    assert rho["lru"] == pytest.approx(hits / queries, abs=RHO_ABS)
    assert rho["capacity_blocks"] == int(
        EngineScrape.of(server).labels("vllm:cache_config_info")["num_gpu_blocks"]
    )
