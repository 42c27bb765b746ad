"""Block-hash replay of vLLM's automatic prefix cache (COST_MODEL.md c.4).

vLLM hashes each full block of `block_size` tokens as hash(parent, tokens, extra keys), the
first block's parent being a fixed root, so equal hashes mean equal prefixes up to that block.
A lookup walks the leading run of cached blocks and is capped at num_tokens - 1 tokens (one
token is always recomputed), so at most floor((n - 1) / block_size) blocks hit.

The replay keeps the equality structure, not vLLM's hash values: Python's hash of a tuple of
ints is deterministic across processes (string hashing is salted, int hashing is not).

Eviction follows vLLM's free queue for requests replayed one after another: a finished
request frees its blocks tail first, so its first block is the most recently used and its
last block is evicted first. Capacity counts full cached blocks only; the running request's
partial block is ignored.

`HashIdCacheReplay` is the same walk over traces that ship pre-hashed blocks (Mooncake's
`hash_ids`, 512 tokens each): there the issue's definition counts every leading block seen
before, the last block covering only the remainder of the prompt, with no num_tokens - 1 cap.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "NONE_HASH",
    "HashIdCacheReplay",
    "PrefixCacheReplay",
    "block_hashes",
    "estimate_rho",
    "estimate_rho_hash_ids",
    "salt_key",
]

NONE_HASH: Final = 0x7F1E_26A7_E000_0001  # root parent of every chain


def block_hashes(
    token_ids: Sequence[int], block_size: int = 16, extra_key: int | None = None
) -> list[int]:
    """Chained hashes of the full blocks of `token_ids`. `extra_key` (an int, e.g. from a
    cache salt or LoRA id) separates chains the way vLLM's extra keys do."""
    if block_size < 1:
        raise ValueError("block_size must be positive")
    parent = NONE_HASH if extra_key is None else hash((NONE_HASH, extra_key))
    out: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        out.append(parent)
    return out


def salt_key(cache_salt: str | None) -> int | None:
    """The `extra_key` of a request's vLLM `cache_salt` (None: the shared namespace)."""
    return None if cache_salt is None else hash(("cache_salt", cache_salt))


class _LruBlocks:
    """A set of block keys with LRU order and an optional capacity."""

    def __init__(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError("capacity must be non-negative")
        self.capacity = capacity
        self._order: OrderedDict[int, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._order)

    def resize(self, capacity: int | None) -> None:
        if capacity is not None and capacity < 0:
            raise ValueError("capacity must be non-negative")
        self.capacity = capacity
        self._evict()

    def _evict(self) -> None:
        if self.capacity is not None:
            while len(self._order) > self.capacity:
                self._order.popitem(last=False)

    def __contains__(self, key: int) -> bool:
        return key in self._order

    def leading_run(self, keys: Sequence[int], limit: int) -> int:
        run = 0
        for key in keys[:limit]:
            if key not in self._order:
                break
            run += 1
        return run

    def touch(self, keys: Sequence[int]) -> None:
        # Tail first, so the head of the request ends most recently used.
        order = self._order
        for key in reversed(keys):
            if key in order:
                order.move_to_end(key)
            else:
                order[key] = None
        self._evict()


class PrefixCacheReplay:
    """Stateful replay of one engine's prefix cache; `capacity_blocks=None` is unbounded.

    `hits` and `queries` count tokens, like `vllm:prefix_cache_hits_total` and
    `vllm:prefix_cache_queries_total`.
    """

    def __init__(self, block_size: int = 16, capacity_blocks: int | None = None) -> None:
        if block_size < 1:
            raise ValueError("block_size must be positive")
        self.block_size = block_size
        self._blocks = _LruBlocks(capacity_blocks)
        self.hits = 0
        self.queries = 0
        self.requests = 0

    @property
    def capacity_blocks(self) -> int | None:
        return self._blocks.capacity

    @property
    def cached_blocks(self) -> int:
        return len(self._blocks)

    def set_capacity(self, capacity_blocks: int | None) -> None:
        """Re-bounds the cache (e.g. once `num_gpu_blocks` is known), evicting LRU blocks."""
        self._blocks.resize(capacity_blocks)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def lookup(self, token_ids: Sequence[int], extra_key: int | None = None) -> int:
        """Tokens a new request would get from the cache; changes nothing."""
        hashes = block_hashes(token_ids, self.block_size, extra_key)
        return self._hit_tokens(hashes, len(token_ids))

    def _hit_tokens(self, hashes: Sequence[int], num_tokens: int) -> int:
        limit = max(num_tokens - 1, 0) // self.block_size
        return self._blocks.leading_run(hashes, limit) * self.block_size

    def lookup_and_insert(
        self,
        token_ids: Sequence[int],
        extra_key: int | None = None,
        generated_ids: Sequence[int] = (),
    ) -> int:
        """Looks the prompt up (vLLM semantics), then caches its full blocks in LRU order.

        With `generated_ids`, the blocks the output completes are cached too; the last
        generated token never has its KV computed, so it cannot complete a block.
        """
        hashes = block_hashes(token_ids, self.block_size, extra_key)
        hit = self._hit_tokens(hashes, len(token_ids))
        self.hits += hit
        self.queries += len(token_ids)
        self.requests += 1
        self._blocks.touch(hashes)
        self.cache_generated(token_ids, generated_ids, extra_key)
        return hit

    def cache_generated(
        self,
        token_ids: Sequence[int],
        generated_ids: Sequence[int],
        extra_key: int | None = None,
    ) -> None:
        """Caches the full blocks a finished request's output completes, as vLLM does: the
        next turn of a conversation, whose prompt holds this answer, hits them. The last
        generated token never has its KV computed, so it cannot complete a block."""
        if not generated_ids:
            return
        computed = [*token_ids, *generated_ids][: len(token_ids) + len(generated_ids) - 1]
        self._blocks.touch(block_hashes(computed, self.block_size, extra_key))


class HashIdCacheReplay:
    """Replay over pre-hashed blocks (Mooncake `hash_ids`), tokens per block `block_tokens`."""

    def __init__(self, block_tokens: int = 512, capacity_blocks: int | None = None) -> None:
        if block_tokens < 1:
            raise ValueError("block_tokens must be positive")
        self.block_tokens = block_tokens
        self._blocks = _LruBlocks(capacity_blocks)
        self.hits = 0
        self.queries = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    def lookup_and_insert(self, hash_ids: Sequence[int], input_length: int) -> int:
        """Prompt tokens covered by the leading blocks already cached; then caches them all."""
        run = self._blocks.leading_run(hash_ids, len(hash_ids))
        hit = min(run * self.block_tokens, input_length)
        self.hits += hit
        self.queries += input_length
        self._blocks.touch(hash_ids)
        return hit


def estimate_rho(
    prompts: Iterable[Sequence[int]],
    block_size: int = 16,
    capacity_blocks: int | None = None,
    answers: Sequence[Sequence[int]] = (),
) -> dict[str, float]:
    """Share of prompt tokens served from the cache, unbounded and LRU-bounded by
    `capacity_blocks` (equal to unbounded when that is None). `answers[i]`, when given, is
    what prompt i generated: its full blocks are cached too, as vLLM caches them."""
    unbounded = PrefixCacheReplay(block_size, None)
    lru = PrefixCacheReplay(block_size, capacity_blocks) if capacity_blocks is not None else None
    for i, prompt in enumerate(prompts):
        answer = answers[i] if i < len(answers) else ()
        unbounded.lookup_and_insert(prompt, generated_ids=answer)
        if lru is not None:
            lru.lookup_and_insert(prompt, generated_ids=answer)
    return {
        "unbounded": unbounded.hit_rate,
        "lru": (lru or unbounded).hit_rate,
    }


def estimate_rho_hash_ids(
    requests: Iterable[tuple[Sequence[int], int]],
    block_tokens: int = 512,
    capacity_blocks: int | None = None,
) -> dict[str, float]:
    """`estimate_rho` for (hash_ids, input_length) requests in arrival order."""
    unbounded = HashIdCacheReplay(block_tokens, None)
    lru = HashIdCacheReplay(block_tokens, capacity_blocks) if capacity_blocks is not None else None
    for hash_ids, input_length in requests:
        unbounded.lookup_and_insert(hash_ids, input_length)
        if lru is not None:
            lru.lookup_and_insert(hash_ids, input_length)
    return {
        "unbounded": unbounded.hit_rate,
        "lru": (lru or unbounded).hit_rate,
    }
