"""Per-endpoint circuit breaker with outlier ejection, as plain state with an injected clock.

Closed: requests flow; `failure_threshold` consecutive failures eject the endpoint (open).
Open: no requests until the ejection time has passed; the ejection time doubles with each
consecutive ejection (capped), so a flapping endpoint stays out longer, as Envoy's outlier
detection does. Half-open: exactly one trial request; success closes the circuit and
resets the ejection count, failure re-opens it. A verdict on a request sent before the
circuit last opened (a long stream still running when the endpoint was ejected) says nothing
about the endpoint since: given its send time, it is ignored while the circuit is not closed.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import dataclass, field


class CircuitState(enum.IntEnum):
    CLOSED = 0
    HALF_OPEN = 1
    OPEN = 2


@dataclass(slots=True)
class CircuitBreaker:
    failure_threshold: int = 5
    base_ejection_s: float = 5.0
    max_ejection_s: float = 60.0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)
    state: CircuitState = CircuitState.CLOSED
    consecutive_failures: int = 0
    ejections: int = 0
    opened_at: float = 0.0
    trial_in_flight: bool = False

    @property
    def ejection_s(self) -> float:
        doublings = min(16, max(0, self.ejections - 1))
        return min(self.max_ejection_s, self.base_ejection_s * (1 << doublings))

    @property
    def observed_state(self) -> CircuitState:
        """The state as it stands now, for metrics and the admin API: an open circuit whose
        ejection time has passed reads half-open (its next request is the trial), not open
        until that request happens to come."""
        if self.state is CircuitState.OPEN and self._ejection_over():
            return CircuitState.HALF_OPEN
        return self.state

    def _ejection_over(self) -> bool:
        return self.clock() >= self.opened_at + self.ejection_s

    def can_send(self) -> bool:
        """Whether a request may be sent now; has no side effects."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.OPEN:
            return self._ejection_over()
        return not self.trial_in_flight

    def on_send(self) -> float:
        """Called when a request is actually sent; an expired open circuit turns half-open.
        Returns the send time, for the verdict on that request."""
        now = self.clock()
        if self.state is CircuitState.OPEN and now >= self.opened_at + self.ejection_s:
            self.state = CircuitState.HALF_OPEN
            self.trial_in_flight = False
        if self.state is CircuitState.HALF_OPEN:
            self.trial_in_flight = True
        return now

    def _stale(self, sent_at: float | None) -> bool:
        return (
            sent_at is not None
            and self.state is not CircuitState.CLOSED
            and sent_at < self.opened_at
        )

    def on_success(self, sent_at: float | None = None) -> None:
        if self._stale(sent_at):
            return  # it closed no circuit: 5 failures, then one old stream ending, closed it
        self.consecutive_failures = 0
        if self.state is not CircuitState.CLOSED:
            self.state = CircuitState.CLOSED
            self.ejections = 0
            self.trial_in_flight = False

    def on_inconclusive(self, sent_at: float | None = None) -> None:
        """The request failed in a way that says nothing about this endpoint (other endpoints
        failed on it alike): no verdict, but a half-open trial is over."""
        if not self._stale(sent_at):
            self.trial_in_flight = False

    def on_failure(self, sent_at: float | None = None) -> None:
        if self._stale(sent_at):
            return
        self.consecutive_failures += 1
        if self.state is CircuitState.HALF_OPEN or (
            self.state is CircuitState.CLOSED
            and self.consecutive_failures >= self.failure_threshold
        ):
            self._open()

    def _open(self) -> None:
        self.state = CircuitState.OPEN
        self.ejections += 1
        self.opened_at = self.clock()
        self.trial_in_flight = False


__all__ = ["CircuitBreaker", "CircuitState"]
