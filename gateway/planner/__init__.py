"""Traffic-regime planner (COST_MODEL.md a, b, d): pure, no I/O.

- `presets`: hardware (H200, B200) and model (Qwen3-30B-A3B, Qwen3-Coder-30B-A3B) presets.
- `params`: typed, YAML-overridable cost, serve and policy parameters (P0 defaults).
- `costmodel`: `CostModel`, CPT(C, rho, r; p, s, k) and its breakevens rho*, r*.
- `planner`: `plan_tier` (b.1 steps 2-3) and the stateful `Planner` (hysteresis, dwell).
- `vllm_args`: the `vllm serve` flags of a tier plan.
- `breakeven`: the paper's breakeven table (`tiergate plan breakeven --json`).
"""
