"""benchmarks/overhead.py reads wrk's output: error answers must not count as throughput."""

from __future__ import annotations

import pytest

from benchmarks.overhead import parse_wrk

WRK = """Running 5s test @ http://127.0.0.1:19000/v1/chat/completions
  1 threads and 8 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.60ms  400.00us  10.00ms   90.00%
  Latency Distribution
     50%    1.58ms
     75%    1.80ms
     90%    2.10ms
     99%    4.13ms
  22929 requests in 5.00s, 10.00MB read
{errors}Requests/sec:   4585.32
Transfer/sec:      2.00MB
"""


def test_a_clean_run_is_read() -> None:
    run = parse_wrk(WRK.format(errors=""), "http://x")
    assert run["requests"] == 22929
    assert run["rps"] == pytest.approx(4585.32)
    assert run["p50_ms"] == pytest.approx(1.58)
    assert run["p99_ms"] == pytest.approx(4.13)


def test_error_answers_fail_the_run() -> None:
    out = WRK.format(errors="  Non-2xx or 3xx responses: 22929\n")
    with pytest.raises(RuntimeError, match="22929 of 22929"):
        parse_wrk(out, "http://x")
