from __future__ import annotations

from gateway.backends.circuit import CircuitBreaker, CircuitState


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_consecutive_failures_only() -> None:
    breaker = CircuitBreaker(failure_threshold=3, clock=Clock())
    breaker.on_failure()
    breaker.on_failure()
    breaker.on_success()  # a success in between resets the count
    breaker.on_failure()
    breaker.on_failure()
    assert breaker.state is CircuitState.CLOSED and breaker.can_send()
    breaker.on_failure()
    assert breaker.state is CircuitState.OPEN and not breaker.can_send()


def test_half_open_allows_exactly_one_trial_then_closes_or_reopens() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, base_ejection_s=5.0, clock=clock)
    breaker.on_failure()
    clock.now += 4.9
    assert not breaker.can_send() and breaker.observed_state is CircuitState.OPEN
    clock.now += 0.2
    assert breaker.can_send()
    # What metrics and /admin/backends show: the trial is open now, before any request.
    assert breaker.state is CircuitState.OPEN and breaker.observed_state is CircuitState.HALF_OPEN
    breaker.on_send()
    assert breaker.state is CircuitState.HALF_OPEN
    assert not breaker.can_send()  # the trial is in flight: nobody else
    breaker.on_failure()
    assert breaker.state is CircuitState.OPEN
    assert breaker.ejection_s == 10.0  # a second ejection in a row lasts twice as long
    clock.now += 10.1
    breaker.on_send()
    breaker.on_success()
    assert breaker.state is CircuitState.CLOSED and breaker.ejections == 0
    assert breaker.ejection_s == 5.0


def test_ejection_time_is_capped() -> None:
    clock = Clock()
    breaker = CircuitBreaker(
        failure_threshold=1, base_ejection_s=5.0, max_ejection_s=30.0, clock=clock
    )
    for _ in range(10):
        breaker.on_failure()
        clock.now += breaker.ejection_s + 0.1
        breaker.on_send()
    assert breaker.ejection_s == 30.0


def test_an_inconclusive_trial_frees_the_half_open_slot_without_a_verdict() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=2, base_ejection_s=5.0, clock=clock)
    breaker.on_failure()
    breaker.on_inconclusive()  # closed: the count of consecutive failures is untouched
    breaker.on_failure()
    assert breaker.state is CircuitState.OPEN
    clock.now += 5.1
    breaker.on_send()
    assert not breaker.can_send()
    breaker.on_inconclusive()  # the trial request failed elsewhere too: try another trial
    assert breaker.state is CircuitState.HALF_OPEN and breaker.can_send()


def test_the_ejection_ends_exactly_at_its_time() -> None:
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=1, base_ejection_s=5.0, clock=clock)
    breaker.on_failure()
    clock.now = 105.0  # opened at 100.0: the 5 s ejection is over now, not a tick later
    assert breaker.can_send() and breaker.observed_state is CircuitState.HALF_OPEN


def test_a_verdict_on_a_request_sent_before_the_ejection_counts_for_nothing() -> None:
    """A long stream sent while the endpoint was healthy ends after five newer requests
    failed and ejected it: its success says nothing about the endpoint now, and closed the
    circuit (ejection count reset); an old failure re-opened a half-open one."""
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=5, base_ejection_s=5.0, clock=clock)
    old = breaker.on_send()
    clock.now += 1.0
    for _ in range(5):
        breaker.on_failure(breaker.on_send())
    assert breaker.state is CircuitState.OPEN
    breaker.on_success(old)
    assert breaker.state is CircuitState.OPEN and breaker.ejections == 1
    clock.now += 5.1
    trial = breaker.on_send()
    assert breaker.state is CircuitState.HALF_OPEN
    breaker.on_failure(old)  # nor does an old failure end the trial
    breaker.on_inconclusive(old)
    assert breaker.state is CircuitState.HALF_OPEN and not breaker.can_send()
    breaker.on_success(trial)
    assert breaker.state is CircuitState.CLOSED and breaker.ejections == 0


def test_an_old_request_failing_after_the_circuit_closed_again_counts() -> None:
    """Stale verdicts are ignored only while the circuit is not closed: once a trial has
    closed it, a failure is news about the endpoint, whenever its request was sent."""
    clock = Clock()
    breaker = CircuitBreaker(failure_threshold=2, base_ejection_s=5.0, clock=clock)
    old = breaker.on_send()
    clock.now += 1.0
    breaker.on_failure()
    breaker.on_failure()
    assert breaker.state is CircuitState.OPEN
    clock.now += 5.0
    breaker.on_success(breaker.on_send())  # the trial closes it
    assert breaker.state is CircuitState.CLOSED
    breaker.on_failure(old)
    breaker.on_failure()
    assert breaker.state is CircuitState.OPEN
