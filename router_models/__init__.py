"""Difficulty router: request features, scorers, isotonic calibration, thresholds, evaluation.

Pure computation and scikit-learn estimators only; no network or server code lives here.
"""
