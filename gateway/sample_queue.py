"""A queue of captured exchanges for the off-path listeners, bounded in items and in bytes.

A captured exchange holds its whole request and relayed answer (up to `max_body_bytes` and
the 64 MiB response cap): a bound on the count alone lets a slow consumer (an engine's slow
/tokenize, a busy top tier) hold count x the largest exchange, gigabytes of them.
"""

from __future__ import annotations

import asyncio
from typing import Final, Generic, TypeVar

__all__ = ["QUEUED_BYTES", "SampleQueue"]

# Bytes of requests and answers, as received, one queue may hold: far more than a consumer
# that keeps up ever has waiting. Held parsed, a request takes up to about 8x its JSON (1,024
# short messages 8.4x, 262,144 token ids 5.7x), so this bounds a queue near 130 MB.
QUEUED_BYTES: Final = 16 * 1024 * 1024

T = TypeVar("T")


class SampleQueue(Generic[T]):
    """`offer` refuses what would pass either bound (an exchange larger than the byte bound
    is taken only into an empty queue, so it is never refused for good); `take` waits."""

    def __init__(self, max_bytes: int = QUEUED_BYTES) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: asyncio.Queue[tuple[T, int]] = asyncio.Queue()

    def empty(self) -> bool:
        return self._items.empty()

    def offer(self, item: T, size: int, max_items: int) -> bool:
        waiting = self._items.qsize()
        if waiting >= max_items or (waiting and self.bytes + size > self.max_bytes):
            return False
        self._items.put_nowait((item, size))
        self.bytes += size
        return True

    async def take(self) -> T:
        item, size = await self._items.get()
        self.bytes -= size
        return item

    def get_nowait(self) -> T:
        item, size = self._items.get_nowait()
        self.bytes -= size
        return item
