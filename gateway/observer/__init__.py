"""Regime estimators (COST_MODEL.md c): what C, rho and r are for observed traffic.

Pure estimators (no I/O): `ngram_replay` (vLLM's n-gram proposer and its replay),
`prefix_replay` (vLLM's chained block-hash prefix cache), `acceptance` (A and A^-1),
`offline_regime` (a trace's regime), `regime` (the rolling `RegimeTracker`) and
`vllm_metrics` (a typed `/metrics` snapshot). `traces` reads trace files.
"""
