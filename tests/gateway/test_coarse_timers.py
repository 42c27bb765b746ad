"""The one-slot timing wheel behind the JSON departure watch and the body deadline."""

from __future__ import annotations

import asyncio
import time

from gateway.coarse_timers import CoarseTimers


def test_entries_fire_once_due_unless_discarded_first() -> None:
    async def scenario() -> None:
        now = [100.0]
        timers = CoarseTimers(1.0, lambda: now[0])
        fired: list[str] = []
        timers.add("old", fired.append, "old")
        now[0] += 0.6
        timers.add("young", fired.append, "young")
        timers.add("done", fired.append, "done")
        assert timers.discard("done")  # ended in time: pending until now, never fires
        now[0] += 0.5  # old has waited 1.1 s, young 0.5 s
        timers.sweep_once()
        assert fired == ["old"] and timers.pending == 1
        assert not timers.discard("old")  # already fired: its owner can tell
        now[0] += 0.6
        timers.sweep_once()
        assert fired == ["old", "young"] and timers.pending == 0

    asyncio.run(scenario())


async def until_idle(timers: CoarseTimers, timeout_s: float = 5.0) -> None:
    """Until the sweep task has ended, a tick after nothing is pending. A fixed sleep could
    end first: after a stall (a garbage collection) the sweep's late tick and the sleep's
    end are due together, and the sleep's end ran before the sweep's next, empty tick."""
    deadline = time.monotonic() + timeout_s
    while timers.sweeping and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


def test_the_sweep_runs_while_something_is_pending_and_then_stops() -> None:
    async def scenario() -> None:
        timers = CoarseTimers(0.02)
        fired: list[int] = []
        timers.add(1, fired.append, 1)
        await until_idle(timers)
        assert fired == [1] and timers.pending == 0
        assert not timers.sweeping  # idle: no task left behind
        timers.add(2, fired.append, 2)  # and it starts again
        assert timers.sweeping
        await until_idle(timers)
        assert fired == [1, 2] and not timers.sweeping

    asyncio.run(scenario())


def test_short_waits_share_one_sweep_task() -> None:
    # Entries discarded before the sweep first runs (a body read at once) must not cost a
    # task each: the sweep sleeps before it looks, so back-to-back requests reuse it.
    async def scenario() -> None:
        timers = CoarseTimers(0.2)
        me = asyncio.current_task()
        sweeps: set[asyncio.Task[object]] = set()
        for key in range(50):
            timers.add(key, print, key)
            assert timers.discard(key)
            await asyncio.sleep(0)  # the sweep task runs its first step here
            sweeps |= asyncio.all_tasks() - {me}
        assert len(sweeps) == 1 and timers.sweeping
        await asyncio.sleep(0.3)  # a tick with nothing pending ends it
        assert not timers.sweeping and not asyncio.all_tasks() - {me}

    asyncio.run(scenario())
