"""Trace readers, the offline regime and `tiergate regime`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.observer.offline_regime import chat_regime, concurrency_stats, length_regime
from gateway.observer.traces import (
    WordTokenizer,
    detect_format,
    parse_azure_csv,
    parse_chat,
    parse_mooncake,
    read_trace,
)

runner = CliRunner()


def test_concurrency_stats_time_weighted() -> None:
    # Two requests overlap for 1 s of a 4 s span: level 1 for 2 s, 2 for 1 s, 0 for 1 s.
    stats = concurrency_stats([(0.0, 2.0), (1.0, 3.0), (3.5, 4.0)])
    assert stats.span_s == 4.0
    assert stats.mean == pytest.approx((2 * 1 + 2 * 1 + 0.5) / 4.0)
    assert (stats.p50, stats.p95, stats.max) == (1.0, 2.0, 2.0)
    assert concurrency_stats([]).mean == 0.0
    with pytest.raises(ValueError):
        concurrency_stats([(2.0, 1.0)])


def test_parsers() -> None:
    moon = parse_mooncake(
        [
            '{"timestamp": 1500, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
            '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [2]}',
        ]
    )
    assert [r.arrival_s for r in moon] == [0.0, 1.5] and moon[1].hash_ids == (0, 1)
    azure = parse_azure_csv(
        [
            "TIMESTAMP,ContextTokens,GeneratedTokens",
            "2023-11-16 18:17:04.0319600,3180,8",
            "2023-11-16 18:17:03.9799600,4808,10",
        ]
    )
    assert azure[0].input_length == 4808 and azure[1].arrival_s == pytest.approx(0.052)
    with pytest.raises(ValueError, match="mooncake line 1: missing field 'input_length'"):
        parse_mooncake(['{"timestamp": 1}'])
    sharegpt = parse_chat(
        '[{"id": "a", "conversations": [{"from": "human", "value": "hi"},'
        ' {"from": "gpt", "value": "hello"}]}]'
    )
    assert [t.role for t in sharegpt[0].turns] == ["user", "assistant"]
    jsonl = parse_chat('{"messages": [{"role": "user", "content": "x"}]}\n')
    assert jsonl[0].turns[0].text == "x"
    assert detect_format(Path("t.csv"), "") == "azure"
    assert detect_format(Path("t.jsonl"), '{"hash_ids": [1]}') == "mooncake"
    with pytest.raises(ValueError, match="--format"):
        detect_format(Path("t.txt"), "hello")


def test_word_tokenizer_is_deterministic() -> None:
    a, b = WordTokenizer(), WordTokenizer()
    text = "def f(x):\n    return x + 1  # again: f(x)"
    assert a.encode(text) == b.encode(text)
    ids = a.encode(text)
    assert ids[:5] == [0, 1, 2, 3, 4]  # def f ( x )
    assert ids.count(a.encode("f")[0]) == 2
    assert len(a) == len(set(ids))


def test_chat_regime_with_replies() -> None:
    convs = parse_chat(
        json.dumps(
            [
                {
                    "id": "1",
                    "conversations": [
                        {"from": "human", "value": "please repeat: the quick brown fox jumps"},
                        {"from": "gpt", "value": "the quick brown fox jumps"},
                        {"from": "human", "value": "again please"},
                        {"from": "gpt", "value": "the quick brown fox jumps"},
                    ],
                }
            ]
        )
    )
    out = chat_regime(convs, block_size=4)
    assert out["r"]["source"] == "assistant replies"
    assert out["r"]["r_iid"] > 0.3  # the replies copy the context
    # Prompts of 10 and 21 word tokens, a first reply of 7: the engine caches the 16 tokens
    # the first prompt and its reply computed (4 full blocks), which the second prompt holds
    # (caching prompts alone, it reused 2 blocks: 8 / 31).
    assert out["rho"]["unbounded"] == pytest.approx(16 / 31)
    assert out["concurrency"] == {"mean": None, "p50": None, "p95": None}
    assert out["lengths"]["l_out"] > 0  # replies were generated: their length is reported


def test_length_regime_shape() -> None:
    out = length_regime(parse_azure_csv(["TIMESTAMP,ContextTokens,GeneratedTokens"]))
    assert out["requests"] == 0 and out["rho"] == {"unbounded": None, "lru": None}


def _regime(args: list[str]) -> dict[str, object]:
    result = runner.invoke(app, ["regime", *args])
    assert result.exit_code == 0, result.output
    doc: dict[str, object] = json.loads(result.stdout)
    return doc


def test_regime_cli_mooncake(shared_data: Path) -> None:
    trace = shared_data / "traces" / "mooncake_conversation_trace.jsonl"
    doc = _regime(["--trace", str(trace), "--json", "--format", "mooncake"])
    assert set(doc) >= {"concurrency", "rho", "r"}
    assert doc["rho"]["unbounded"] == pytest.approx(0.3736, abs=1e-4)  # type: ignore[index]
    assert doc["rho"]["capacity_blocks"] == 2602  # type: ignore[index]  # B200 bf16
    assert set(doc["concurrency"]) >= {"mean", "p50", "p95"}  # type: ignore[arg-type]


def test_regime_cli_azure(shared_data: Path) -> None:
    doc = _regime(["--trace", str(shared_data / "traces" / "azure2023_code.csv"), "--json"])
    conc = doc["concurrency"]
    assert conc["mean"] > 0 and conc["p95"] >= conc["p50"]  # type: ignore[index]
    assert doc["service_model"] == {
        "prefill_tokens_per_s": 10000.0,
        "tpot_s": 0.025,
        "queue_s": 0.0,
    }
    slower = _regime(
        ["--trace", str(shared_data / "traces" / "azure2023_code.csv"), "--json", "--tpot-ms", "50"]
    )
    assert slower["concurrency"]["mean"] > conc["mean"]  # type: ignore[index]


def test_regime_cli_sharegpt(shared_data: Path) -> None:
    path = shared_data / "traces" / "sharegpt" / "ShareGPT_V3_filtered_1000.json"
    doc = _regime(["--trace", str(path), "--json"])
    r = doc["r"]
    assert 0.0 < r["r_iid"] < 0.5 and r["source"].startswith("self-replay")  # type: ignore[index]
    assert doc["rho"]["tokenizer"] == "word"  # type: ignore[index]
    # Only user turns: nothing was generated, so there is no output length to report.
    assert doc["lengths"]["l_out"] is None and doc["lengths"]["l_in"] > 0  # type: ignore[index]
    # The same trace read twice gives the same numbers (deterministic tokenizer).
    again = _regime(["--trace", str(path), "--json"])
    assert again == doc


def test_regime_cli_table_and_errors(shared_data: Path, tmp_path: Path) -> None:
    path = shared_data / "traces" / "azure2023_conv.csv"
    table = runner.invoke(app, ["regime", "--trace", str(path)])
    assert table.exit_code == 0 and "C mean" in table.stdout
    bad = tmp_path / "x.txt"
    bad.write_text("nothing")
    result = runner.invoke(app, ["regime", "--trace", str(bad)])
    assert result.exit_code == 2 and "--format" in result.output
    assert read_trace(path).format == "azure"


def test_a_malformed_or_empty_trace_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"timestamp": 0, "input_length": 3, "output_length": 1}\n{"timestamp": 1}\n')
    with pytest.raises(ValueError, match=r"broken.jsonl: mooncake line 2: missing field"):
        read_trace(broken, "mooncake")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(ValueError, match=r"empty.jsonl: no requests in this mooncake trace"):
        read_trace(empty, "mooncake")


@pytest.mark.parametrize(
    ("row", "says"),
    [
        (
            '"timestamp": Infinity, "input_length": 100, "output_length": 10',
            "timestamp is not a finite number",
        ),
        (
            '"timestamp": NaN, "input_length": 100, "output_length": 10',
            "timestamp is not a finite number",
        ),
        (
            '"timestamp": 5, "input_length": Infinity, "output_length": 10',
            "input_length is not a finite number",
        ),
        (
            '"timestamp": 5, "input_length": -3, "output_length": 10',
            "input_length is not a token count",
        ),
        (  # float(True) is 1: a boolean passed for one token
            '"timestamp": 5, "input_length": true, "output_length": 10',
            "input_length is not a number",
        ),
        (
            '"timestamp": 5, "input_length": 3, "output_length": 1, "hash_ids": [Infinity]',
            "cannot convert float infinity",
        ),
    ],
)
def test_mooncake_rejects_non_finite_values_by_line(tmp_path: Path, row: str, says: str) -> None:
    """json reads Infinity and NaN; they reached the regime (and its JSON) as times."""
    trace = tmp_path / "t.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 100, "output_length": 10, "hash_ids": [1]}\n'
        "{" + row + "}\n"
    )
    with pytest.raises(ValueError, match=rf"t.jsonl: mooncake line 2: {says}"):
        read_trace(trace, "mooncake")
    result = runner.invoke(app, ["regime", "--trace", str(trace), "--json"])
    assert result.exit_code == 2 and says in result.output


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (b'{"timestamp": 0, "input_length": 3, "output_length": 1}\n{"x": "\xff"}\n', "line 2"),
        (
            b'{"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": '
            + b"[" * 100_000
            + b"]" * 100_000
            + b"}\n",
            "mooncake line 1",
        ),
    ],
    ids=["not-utf8", "nested-too-deep"],
)
def test_an_unreadable_trace_is_an_error_naming_file_and_line(
    tmp_path: Path, content: bytes, says: str
) -> None:
    """A byte that is not UTF-8 was an error naming neither file nor line; JSON nested too
    deeply was a traceback (RecursionError)."""
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(content)
    with pytest.raises(ValueError, match=rf"t.jsonl: {says}"):
        read_trace(trace, "mooncake")
    for command in (["regime", "--trace", str(trace)], ["plan", "--trace", str(trace)]):
        result = runner.invoke(app, command)
        assert result.exit_code == 2, result.output
        assert f"t.jsonl: {says}" in result.output


def test_a_chat_jsonl_error_names_the_line_of_the_file(tmp_path: Path) -> None:
    """json's own position counts within the line, so every error said 'line 1'."""
    good = json.dumps({"messages": [{"role": "user", "content": "hi"}]})
    trace = tmp_path / "chat.jsonl"
    trace.write_text(f"{good}\n{good}\n{{bad\n")
    with pytest.raises(ValueError, match=r"chat.jsonl: chat line 3: "):
        read_trace(trace)


@pytest.mark.parametrize("cells", ["-40,14", "40,-14"])
def test_azure_refuses_a_negative_length(tmp_path: Path, cells: str) -> None:
    """A negative length gave a negative service time: a wrong concurrency and l_in, exit 0."""
    trace = tmp_path / "a.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10\n"
        f"2023-11-16 18:17:04.0319600,{cells}\n"
    )
    with pytest.raises(ValueError, match=r"a.csv: azure line 3: \w+Tokens is not a token count"):
        read_trace(trace)


def test_regime_json_has_no_bare_infinity(tmp_path: Path) -> None:
    """A service time near the float limit overflowed the mean concurrency, printed as a
    bare Infinity: not JSON (jq and JavaScript refuse it). It is null, as the router's are."""
    trace = tmp_path / "a.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:17:03.9799600,4808,10000\n"
        "2023-11-16 18:17:04.0319600,3180,10000\n"
    )
    result = runner.invoke(app, ["regime", "--trace", str(trace), "--tpot-ms", "1e308", "--json"])
    assert result.exit_code == 0, result.output

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    doc = json.loads(result.stdout, parse_constant=refuse)
    assert doc["concurrency"]["mean"] is None and doc["requests"] == 2


def test_regime_json_writes_an_integer_past_64_bits(tmp_path: Path) -> None:
    """--capacity-blocks has no upper bound and is echoed back; the strict writer (orjson)
    refused an integer past 64 bits with a TypeError traceback, where json.dumps wrote it."""
    trace = tmp_path / "m.jsonl"
    trace.write_text(
        '{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'
        '{"timestamp": 1000, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}\n'
    )
    blocks = 10**23
    args = ["regime", "--trace", str(trace), "--capacity-blocks", str(blocks), "--json"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rho"]["capacity_blocks"] == blocks


@pytest.mark.parametrize("separator", ["\u2028", "\u0085"])
def test_a_jsonl_row_with_a_line_separator_in_a_string_is_one_row(
    tmp_path: Path, separator: str
) -> None:
    """JSON allows these raw inside a string; str.splitlines split the row there, so a valid
    chat log (or a Mooncake row with a text field) was refused as 'Unterminated string'."""
    chat = tmp_path / "chat.jsonl"
    turn = {"role": "user", "content": f"first{separator}second"}
    chat.write_text(
        json.dumps({"messages": [turn]}, ensure_ascii=False) + "\n{oops\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match="chat line 2:"):  # the first row read whole
        read_trace(chat, "chat")
    moon = tmp_path / "m.jsonl"
    row = {"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [0], "x": separator}
    moon.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert len(read_trace(moon, "mooncake").requests) == 1
