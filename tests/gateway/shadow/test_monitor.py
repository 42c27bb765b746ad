"""The calibration monitor's drift alarm and calibration error."""

import pytest

from gateway.shadow.monitor import CalibrationMonitor, Label


def test_labels_without_a_prediction_do_not_raise_the_drift_alarm() -> None:
    monitor = CalibrationMonitor(window=1000, margin=0.1, min_labels=50)
    for i in range(100):  # routed and perfectly calibrated: predicted 0.8, 80% adequate
        monitor.add("t", "nvfp4", Label(0.8, 0.1, i % 5 != 0, 0.0))
    for i in range(100):  # pinned by the client to the cheap tier: no prediction, harder
        monitor.add("t", "nvfp4", Label(None, None, i % 10 < 3, 0.0))
    summary = monitor.summary("t", "nvfp4")
    assert summary.observed == 0.55  # still the share of every label judged adequate
    assert not summary.drift


def test_scored_labels_below_their_prediction_raise_the_drift_alarm() -> None:
    monitor = CalibrationMonitor(window=1000, margin=0.1, min_labels=50)
    for i in range(100):  # predicted 0.8, only 50% adequate
        monitor.add("t", "nvfp4", Label(0.8, 0.1, i % 2 == 0, 0.0))
    assert monitor.summary("t", "nvfp4").drift


def test_a_reload_applies_new_margin_min_labels_and_window_and_keeps_labels() -> None:
    monitor = CalibrationMonitor(window=1000, margin=0.1, min_labels=5)
    for i in range(10):
        monitor.add("t", "nvfp4", Label(0.8, 0.1, i >= 4, 0.0))  # observed 0.6
    assert monitor.summary("t", "nvfp4").drift
    monitor.reconfigure(window=1000, margin=0.3, min_labels=5)
    assert not monitor.summary("t", "nvfp4").drift  # 0.6 is not below 0.8 - 0.3
    monitor.reconfigure(window=1000, margin=0.1, min_labels=50)
    assert not monitor.summary("t", "nvfp4").drift  # too few labels to alarm
    monitor.reconfigure(window=4, margin=0.1, min_labels=4)
    summary = monitor.summary("t", "nvfp4")
    assert (summary.n, summary.observed) == (4, 1.0)  # the newest four, all adequate


def test_observed_exactly_at_the_margin_is_no_drift() -> None:
    """Ten predictions of 0.7 average 0.7000000000000001 in floating point: 6 adequate of 10 sat
    exactly at the margin and raised the alarm."""
    monitor = CalibrationMonitor(window=100, margin=0.1, min_labels=10)
    for i in range(10):
        monitor.add("t", "nvfp4", Label(0.7, 0.1, i < 6, 0.0))
    assert not monitor.summary("t", "nvfp4").drift
    monitor.add("t", "nvfp4", Label(0.7, 0.1, False, 0.0))  # 6 of 11: below the margin
    assert monitor.summary("t", "nvfp4").drift


def test_no_calibration_error_below_min_labels() -> None:
    """One label at 0.8 that proved adequate reads an ECE of 0.2: exported, it held the
    calibration-error alert (> 0.10) on for good on a tier shadow replays seldom reach."""
    monitor = CalibrationMonitor(window=100, margin=0.1, min_labels=10)
    monitor.add("t", "nvfp4", Label(0.8, 0.1, True, 0.0))
    for _ in range(20):  # labels without a prediction do not count towards it
        monitor.add("t", "nvfp4", Label(None, None, True, 0.0))
    assert monitor.summary("t", "nvfp4").ece is None
    for i in range(9):
        monitor.add("t", "nvfp4", Label(0.8, 0.1, i < 7, 0.0))  # 8 of 10 adequate
    assert monitor.summary("t", "nvfp4").ece == pytest.approx(0.0)
