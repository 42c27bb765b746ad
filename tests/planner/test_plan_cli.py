"""`tiergate plan` and `tiergate plan breakeven` through the real Typer app."""

from __future__ import annotations

import json
import random
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from typer.testing import CliRunner

from gateway.cli.main import app
from gateway.cli.plan_cmd import _current
from gateway.planner.planner import TierConfig

runner = CliRunner()

EXPECTED_BREAKEVEN = {
    "rho_star": {p: {"32": 0.064, "256": 0.512} for p in ("fp16", "fp8", "w4a16", "nvfp4")},
    "r_star": {
        "fp16": {"32": 0.06, "256": 0.29},
        "fp8": {"32": 0.0812, "256": 0.3308},
        "w4a16": {"32": 0.1309, "256": 0.417},
        "nvfp4": {"32": 0.1406, "256": 0.448},
    },
    "precision_ratio": {"below_knees": 0.25, "plateau": 0.1855},
    "knees": {"fp16": 325, "fp8": 401, "w4a16": 438, "nvfp4": 438},
}


def _json(args: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    result = runner.invoke(app, args, env=env)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_breakeven_json_exact() -> None:
    result = runner.invoke(app, ["plan", "breakeven", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == EXPECTED_BREAKEVEN
    assert list(json.loads(result.stdout)) == ["rho_star", "r_star", "precision_ratio", "knees"]


def test_breakeven_more_concurrencies_and_table() -> None:
    doc = _json(["plan", "breakeven", "--json", "--concurrency", "1,1024"])
    assert doc["r_star"]["fp16"] == {"1": 0.0163, "1024": 0.3412}
    assert doc["r_star"]["nvfp4"] == {"1": 0.083, "1024": 0.6159}
    assert _json(["plan", "breakeven", "--json", "--hardware", "h200"])["knees"] == {
        "fp16": 198,
        "fp8": 274,
        "w4a16": 312,
        "nvfp4": 312,
    }
    table = runner.invoke(app, ["plan", "breakeven"])
    assert table.exit_code == 0 and "0.1855" in table.stdout


def test_plan_regime_json() -> None:
    doc = _json(
        [
            "plan",
            "--regime",
            "C=256,rho=0.3,r=0.3",
            "--hardware",
            "b200",
            "--json",
            "--candidates",
            "fp16,fp8,nvfp4",
            "--current",
            "fp16,s=1,k=0",
        ]
    )
    tier = doc["tiers"]["default"]
    assert (tier["precision"], tier["speculative"], tier["prefix_caching"]) == (
        "nvfp4",
        False,
        False,
    )
    assert tier["regime"]["concurrency"] == 256
    assert any("not inherited" in r for r in tier["reasons"])
    assert tier["vllm_args"][0] == "nvidia/Qwen3-30B-A3B-NVFP4"


def test_plan_coding_agent_cli() -> None:
    doc = _json(["plan", "--regime", "C=32,rho=0.85,r=0.6", "--q-min", "0.99", "--json"])
    tier = doc["tiers"]["default"]
    assert (tier["precision"], tier["speculative"], tier["prefix_caching"]) == ("fp8", True, True)


def test_plan_write_overlay(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["plan", "--regime", "C=32,rho=0.3,r=0.2", "--write", str(tmp_path / "deploy")]
    )
    assert result.exit_code == 0, result.output
    overlay = yaml.safe_load((tmp_path / "deploy" / "overlay.yaml").read_text())
    tier = overlay["tiers"]["default"]
    assert tier["command"].startswith("vllm serve ")
    assert "--speculative-config" in tier["vllm_args"]
    args = json.loads((tmp_path / "deploy" / "default.args.json").read_text())
    assert args == tier["vllm_args"]


@pytest.mark.parametrize(
    "args",
    [
        ["plan"],
        ["plan", "--regime", "C=1,rho=0.1"],
        ["plan", "--regime", "C=1,rho=2,r=0"],
        ["plan", "--regime", "C=1,rho=0.1,r=0.1", "--hardware", "a100"],
        ["plan", "--regime", "C=1,rho=0.1,r=0.1", "--candidates", "int3"],
        ["plan", "--regime", "C=1,rho=0.1,r=0.1", "--trace", "x.jsonl"],
    ],
)
def test_plan_usage_errors(args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert "error:" in result.output


REGIME = "C=32,rho=0.85,r=0.6"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["plan", "--params", "{bad}", "--regime", REGIME], "not valid YAML"),
        (["plan", "breakeven", "--params", "{bad}"], "not valid YAML"),
        (["plan", "--regime", REGIME, "--write", "{file}"], "--write"),
        (["plan", "--regime", REGIME, "--write", "{file}/sub"], "--write"),
        (["plan", "breakeven", "--concurrency", "0"], "concurrency must be positive"),
        (["plan", "--regime", REGIME + ",L_out=0"], "L_out must be a length > 0"),
        (["plan", "--regime", REGIME + ",c=64"], "regime item 'c' is given twice"),
        (["regime", "--trace", "{trace}", "--prefill-tps", "0"], "prefill tokens/s"),
    ],
)
def test_bad_inputs_end_in_one_line_not_a_traceback(
    args: list[str], says: str, tmp_path: Path
) -> None:
    """Each of these raised a traceback (a YAML parse error, an existing file as --write,
    a zero concurrency or output length, a zero prefill rate)."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("not: [valid\n")
    afile = tmp_path / "afile"
    afile.write_text("")
    trace = tmp_path / "trace.csv"
    trace.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
    )
    argv = [a.format(bad=bad, file=afile, trace=trace) for a in args]
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, result.output
    assert "error:" in result.output and says in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


class _Admin(BaseHTTPRequestHandler):
    body: ClassVar[dict[str, Any]] = {}
    seen_auth: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen_auth.append(self.headers.get("Authorization"))
        if self.path != "/admin/regime" or self.headers.get("Authorization") != "Bearer s3cret":
            self.send_response(401)
            self.end_headers()
            return
        data = json.dumps(self.body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def admin_server() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_plan_from_gateway(admin_server: str) -> None:
    _Admin.body = {
        "tiers": {
            "cheap": {
                "precision": "nvfp4",
                "concurrency": {"mean": 256.0},
                "rho": {"unbounded": 0.9, "lru": 0.7},
                "r": {"r_iid": 0.30},
                "current": {"speculative": True, "prefix_caching": False},
            },
            "strong": {
                "precision": "bf16",
                "concurrency": {"mean": 32.0},
                "rho": {"unbounded": 0.5, "lru": 0.4, "engine": 0.45},
                "r": {"r_iid": 0.30, "r_engine": 0.05},
            },
            "idle": {"precision": "fp8", "concurrency": {"mean": None}, "rho": {}, "r": {}},
            # Traffic, but no request sampled yet: rho and r are unknown, not zero.
            "unsampled": {
                "precision": "w4a16",
                "concurrency": {"mean": 0.002},
                "rho": {"unbounded": None, "lru": None, "engine": None, "sampled_tokens": 0},
                "r": {"r_iid": None, "r_engine": None, "rounds": 0},
            },
        }
    }
    result = runner.invoke(
        app,
        ["plan", "--from-gateway", admin_server + "/", "--json"],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert _Admin.seen_auth[-1] == "Bearer s3cret"
    cheap, strong = doc["tiers"]["cheap"], doc["tiers"]["strong"]
    assert "idle" not in doc["tiers"]
    assert "unsampled" not in doc["tiers"]
    assert "tier unsampled: rho and r not measured yet" in result.stderr
    # Tier precision is fixed by the ladder; toggles are planned at that precision.
    assert (cheap["precision"], cheap["speculative"], cheap["prefix_caching"]) == (
        "nvfp4",
        False,
        True,
    )
    assert strong["precision"] == "bf16"
    assert strong["regime"]["rho"] == 0.45 and strong["regime"]["r"] == 0.05  # engine first
    assert (strong["speculative"], strong["prefix_caching"]) == (False, True)
    # Re-choosing precisions: the cheap tier's running flags are reported as not inherited.
    moved = _json(
        [
            "plan",
            "--from-gateway",
            admin_server,
            "--json",
            "--reselect-precision",
            "--candidates",
            "fp16,nvfp4",
        ],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    assert moved["tiers"]["strong"]["precision"] == "nvfp4"


def test_plan_from_gateway_errors(admin_server: str) -> None:
    denied = runner.invoke(
        app, ["plan", "--from-gateway", admin_server], env={"TIERGATE_ADMIN_TOKEN": "wrong"}
    )
    assert denied.exit_code == 2 and "HTTP 401" in denied.output
    unreachable = runner.invoke(app, ["plan", "--from-gateway", "http://127.0.0.1:9"])
    assert unreachable.exit_code == 2 and "cannot reach" in unreachable.output


def test_plan_from_gateway_that_measured_nothing_writes_nothing(
    admin_server: str, tmp_path: Path
) -> None:
    """A gateway with no sampled request yet (just started, or reloaded) plans no tier: the
    command used to exit 0 and write an overlay with `tiers: {}` over the earlier one."""
    _Admin.body = {
        "tiers": {
            "cheap": {
                "precision": "nvfp4",
                "concurrency": {"mean": 0.01},
                "rho": {"unbounded": None, "lru": None, "engine": None, "sampled_tokens": 0},
                "r": {"r_iid": None, "r_engine": None, "rounds": 0},
            }
        }
    }
    overlay = tmp_path / "h200" / "overlay.yaml"
    overlay.parent.mkdir()
    overlay.write_text("earlier plan\n")
    result = runner.invoke(
        app,
        ["plan", "--from-gateway", admin_server, "--write", str(overlay.parent)],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    assert result.exit_code == 2, result.output
    assert "no tier could be planned yet" in result.stderr
    assert overlay.read_text() == "earlier plan\n"


def test_plan_from_trace(shared_data: Path) -> None:
    trace = shared_data / "traces" / "mooncake_conversation_trace.jsonl"
    doc = _json(["plan", "--trace", str(trace), "--json"])
    tier = doc["tiers"]["default"]
    assert tier["precision"] == "nvfp4" and not tier["speculative"]
    assert tier["regime"]["concurrency"] == pytest.approx(33.05, abs=0.01)
    assert "mooncake" in tier["regime_source"]
    azure = _json(["plan", "--trace", str(shared_data / "traces" / "azure2023_conv.csv"), "--json"])
    assert azure["tiers"]["default"]["regime"]["rho"] == 0.0
    # Length-only traces cannot show rho or r: the 0 they are planned with is said out loud.
    result = runner.invoke(app, ["plan", "--trace", str(trace), "--json"])
    assert (
        "cannot measure r (mooncake trace); its flag stays as --current when given, else it is planned as 0"
        in result.stderr
    )


def test_plan_from_chat_trace_needs_concurrency(shared_data: Path) -> None:
    chat = shared_data / "traces" / "sharegpt" / "ShareGPT_V3_filtered_1000.json"
    missing = runner.invoke(app, ["plan", "--trace", str(chat)])
    assert missing.exit_code == 2 and "--concurrency" in missing.output


def test_current_flags_default_to_vllms() -> None:
    assert _current("fp8") == TierConfig("fp8", speculative=False, prefix_caching=True)
    assert _current("fp8,s=1,k=0") == TierConfig("fp8", speculative=True, prefix_caching=False)


def _error_line(args: list[str]) -> str:
    """Runs a command that must fail cleanly; its one line of output."""
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


@pytest.mark.parametrize(
    ("yaml_text", "says"),
    [
        ("cost: {gpu_memory_fraction: 0.3}", "bf16 (weights do not fit: K = 0"),
        ("cost: {l_ctx: 100000000}", "no feasible precision"),
    ],
)
def test_nothing_fits_is_one_line_and_exit_2(tmp_path: Path, yaml_text: str, says: str) -> None:
    """K = 0 raised ZeroDivisionError with a traceback."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml_text)
    regime = ["plan", "--regime", "C=32,rho=0.1,r=0.1", "--params", str(params)]
    assert says in _error_line([*regime, "--candidates", "bf16"])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["plan", "--regime", "C=256,rho=0.3,r=0.3,L_in=0"], "L_in must be a length > 0"),
        (["plan", "--regime", "C=inf,rho=0.3,r=0.3"], "concurrency must be finite"),
        # 1/C overflows the cost per token: no plan (and no Infinity in the JSON)
        (["plan", "--regime", "C=1e-320,rho=0,r=0", "--json"], "at least 1e-09"),
        (["plan", "--regime", "C=32,rho=0.3,r=0.3", "--q-min", "nan"], "Q_min must be in [0, 1]"),
        # c_pre * L_in underflowed to 0: a ZeroDivisionError traceback
        (["plan", "--regime", "C=1,rho=0,r=0,L_in=1e-320"], "L_in must be a length > 0"),
        # T_req / L_out overflowed: "expected_cpt": Infinity (not JSON)
        (["plan", "--regime", "C=1,rho=0,r=0,L_in=1e308,L_out=1e-9", "--json"], "CPT overflows"),
    ],
)
def test_a_regime_that_cannot_be_costed_is_one_line(args: list[str], says: str) -> None:
    """L_in = 0 divided by zero; C = inf printed "concurrency": Infinity (not JSON)."""
    assert says in _error_line(args)


@pytest.mark.parametrize(
    ("yaml_text", "fields"),
    [
        ("cost: {eta: {nvfp4: 0}}", ["cost.eta.nvfp4"]),
        ("cost: {eta: {nvfp4: 1.5}}", ["cost.eta.nvfp4"]),
        (
            "cost: {eta: {nvfp4: .nan}, quality: {fp8: .nan}}",
            ["cost.eta.nvfp4", "cost.quality.fp8"],
        ),
        ("cost: {l_in: abc, max_num_seqs: -1}", ["cost.l_in", "cost.max_num_seqs"]),
        ("cost: {beta: .inf}", ["cost.beta"]),
        # The per-batch speculation table scans every batch size up to it: 1e8 hung.
        ("cost: {max_num_seqs: 100000000}", ["cost.max_num_seqs"]),
    ],
)
def test_bad_params_name_their_fields_in_one_line(
    tmp_path: Path, yaml_text: str, fields: list[str]
) -> None:
    """eta 0 divided by zero, eta NaN printed "r_star": NaN, and a bad field printed
    pydantic's multi-line report with its URLs."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml_text)
    for command in (["plan", "--regime", REGIME], ["plan", "breakeven"]):
        line = _error_line([*command, "--params", str(params)])
        assert all(field in line for field in fields) and "pydantic.dev" not in line


def test_params_that_are_not_utf8_are_named(tmp_path: Path) -> None:
    """The error was the codec's own ('utf-8' codec can't decode byte ...), naming no file."""
    params = tmp_path / "params.yaml"
    params.write_bytes(b"cost: {l_in: \xff}\n")
    for command in (["plan", "--regime", REGIME], ["plan", "breakeven"]):
        line = _error_line([*command, "--params", str(params)])
        assert "params.yaml: not UTF-8 text" in line


@pytest.mark.parametrize(
    ("yaml_text", "command"),
    [
        ("cost: {gamma_over_c_pre: 1e308}", ["plan", "--regime", REGIME]),
        (
            "hardware: {name: x, hbm_bytes: 1e308, bandwidth: 1e-300, bf16_flops: 1e308, "
            "compute_capability: 100}",
            ["plan", "breakeven"],
        ),
    ],
)
def test_json_has_no_bare_nan_or_infinity(
    tmp_path: Path, yaml_text: str, command: list[str]
) -> None:
    """rho* past any prefix share printed "rho_star": Infinity, a 0/0 precision ratio NaN:
    not JSON (jq refuses it). They are null."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml_text)
    result = runner.invoke(app, [*command, "--params", str(params), "--json"])
    assert result.exit_code == 0, result.output

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    json.loads(result.stdout, parse_constant=refuse)
    assert "null" in result.stdout


def test_breakeven_refuses_negative_digits() -> None:
    """--digits -3 rounded every figure to 0.0 and exited 0."""
    result = runner.invoke(app, ["plan", "breakeven", "--digits", "-3"])
    assert result.exit_code == 2 and "--digits" in result.output


def test_breakeven_rho_star_is_at_b_eff_like_r_star(tmp_path: Path) -> None:
    """rho* = 0.002 * B_eff with B_eff = min(C, K): at C = 1024 above the FP16 knee 325 it
    is 0.65, not 2.048 (r* in the same table already capped at the knee)."""
    doc = _json(["plan", "breakeven", "--json", "--concurrency", "32,1024"])
    assert doc["rho_star"]["fp16"] == {"32": 0.064, "1024": 0.65}
    # Each precision at its own knee: above FP16's, NVFP4 needs more sharing (Paper B).
    assert doc["rho_star"]["nvfp4"] == {"32": 0.064, "1024": 0.876}
    # A precision that does not fit has no breakeven: null, not a ZeroDivisionError.
    params = tmp_path / "params.yaml"
    params.write_text("cost: {gpu_memory_fraction: 0.3}")
    tight = _json(["plan", "breakeven", "--json", "--params", str(params)])
    assert tight["knees"]["fp16"] == 0 and tight["r_star"]["fp16"] == {"32": None, "256": None}
    assert tight["rho_star"]["fp16"] == {"32": None, "256": None}
    assert tight["r_star"]["nvfp4"]["32"] == 0.1406


def test_plan_trace_measures_r_with_the_served_ngram_settings(tmp_path: Path) -> None:
    """c.1: r is replayed with the served prompt_lookup_min/max and num_speculative_tokens;
    `plan --trace` used 2/4/4 whatever `--params` said."""
    from gateway.cli.regime_cmd import compute_trace_regime

    rng = random.Random(3)
    rows = []
    for i in range(30):
        prompt = " ".join(f"w{rng.randrange(40)}" for _ in range(120))
        words = prompt.split()
        start = rng.randrange(80)
        reply = " ".join(words[start : start + 25] + [f"x{rng.randrange(40)}" for _ in range(8)])
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": reply}]
        rows.append(json.dumps({"id": i, "messages": messages}))
    trace = tmp_path / "chat.jsonl"
    trace.write_text("\n".join(rows) + "\n")
    params = tmp_path / "params.yaml"
    params.write_text(
        "cost: {num_speculative_tokens: 8}\nserve: {prompt_lookup_min: 5, prompt_lookup_max: 6}"
    )
    served = compute_trace_regime(trace, ngram_min=5, ngram_max=6, num_spec_tokens=8)
    default = compute_trace_regime(trace)
    assert served["r"]["r_iid"] != pytest.approx(default["r"]["r_iid"])
    doc = _json(
        ["plan", "--trace", str(trace), "--concurrency", "8", "--params", str(params), "--json"]
    )
    assert doc["tiers"]["default"]["regime"]["r"] == pytest.approx(served["r"]["r_iid"])


def test_plan_from_gateway_takes_c_as_the_live_planner_does(
    admin_server: str, tmp_path: Path
) -> None:
    """C per engine: max(gateway mean / endpoints, engine mean). A tier with only engine
    traffic was skipped as "no traffic"; a tier behind several replicas used the whole tier's
    count. A fixed precision skips the native-compute filter too, as live."""
    _Admin.body = {
        "tiers": {
            "engine_only": {
                "precision": "nvfp4",
                "concurrency": {"mean": None, "engine_mean": 40.0},
                "rho": {"engine": 0.5},
                "r": {"r_engine": 0.3},
            },
            "replicated": {
                "precision": "bf16",
                "concurrency": {"mean": 20.0, "engine_mean": 4.0, "endpoints": 2},
                "rho": {"lru": 0.5},
                "r": {"r_iid": 0.3},
                "lengths": {"l_in": 1000.0, "l_out": 0.0},  # no completed request yet
            },
            # A non-finite count (JSON's Infinity) reads as unknown: one engine.
            "odd_count": {
                "precision": "bf16",
                "concurrency": {"mean": 40.0, "endpoints": float("inf")},
                "rho": {"lru": 0.5},
                "r": {"r_iid": 0.3},
            },
        }
    }
    # On an H200 NVFP4 is emulated (Marlin); the tier runs it anyway, so it is planned.
    params = tmp_path / "params.yaml"
    params.write_text("hardware: h200\npolicy: {require_native_compute: true}")
    doc = _json(
        ["plan", "--from-gateway", admin_server, "--json", "--params", str(params)],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    assert doc["tiers"]["engine_only"]["precision"] == "nvfp4"
    assert doc["tiers"]["engine_only"]["regime"]["concurrency"] == 40.0
    assert doc["tiers"]["replicated"]["regime"]["concurrency"] == 10.0
    assert doc["tiers"]["replicated"]["regime"]["l_out"] is None
    assert doc["tiers"]["odd_count"]["regime"]["concurrency"] == 40.0


def test_a_partial_plan_keeps_the_earlier_overlays_other_tiers(
    admin_server: str, tmp_path: Path
) -> None:
    """A gateway that has sampled only some tiers (just reloaded, or traffic that all went
    to the cheap ones) plans only those: the rewrite dropped the others from the overlay
    and left their args files behind."""
    cheap = {
        "precision": "nvfp4",
        "concurrency": {"mean": 256.0},
        "rho": {"unbounded": 0.9, "lru": 0.7},
        "r": {"r_iid": 0.30},
    }
    strong = {
        "precision": "bf16",
        "concurrency": {"mean": 32.0},
        "rho": {"unbounded": 0.5, "lru": 0.4},
        "r": {"r_iid": 0.05},
    }
    unsampled = {"precision": "bf16", "concurrency": {"mean": 0.01}, "rho": {}, "r": {}}
    command = ["plan", "--from-gateway", admin_server, "--write", str(tmp_path)]
    env = {"TIERGATE_ADMIN_TOKEN": "s3cret"}
    _Admin.body = {"tiers": {"cheap": cheap, "strong": strong}}
    assert runner.invoke(app, command, env=env).exit_code == 0
    first = yaml.safe_load((tmp_path / "overlay.yaml").read_text())
    _Admin.body = {"tiers": {"cheap": {**cheap, "rho": {"unbounded": 0.1, "lru": 0.1}}}}
    _Admin.body["tiers"]["strong"] = unsampled
    result = runner.invoke(app, command, env=env)
    assert result.exit_code == 0, result.output
    assert "kept tier strong from the earlier overlay" in result.stderr
    second = yaml.safe_load((tmp_path / "overlay.yaml").read_text())
    assert second["tiers"]["strong"] == first["tiers"]["strong"]
    assert set(second["tiers"]) == {"cheap", "strong"}
    written = json.loads((tmp_path / "strong.args.json").read_text())
    assert written == second["tiers"]["strong"]["vllm_args"]


def test_plan_from_gateway_ignores_engine_r_under_a_per_batch_table_as_live(
    admin_server: str, tmp_path: Path
) -> None:
    """With `serve.batch_dependent_speculation`, rounds at a k = 0 batch draft nothing, so
    the live planner plans on the replayed r, not the engine's; the CLI must agree."""
    _Admin.body = {
        "tiers": {
            "copy": {
                "precision": "bf16",
                "concurrency": {"mean": 32.0},
                "rho": {"lru": 0.5},
                "r": {"r_engine": 0.02, "r_reference": 0.6},
            }
        }
    }
    params = tmp_path / "params.yaml"
    params.write_text("serve: {batch_dependent_speculation: true}")
    doc = _json(
        ["plan", "--from-gateway", admin_server, "--json", "--params", str(params)],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    copy = doc["tiers"]["copy"]
    assert copy["regime"]["r"] == 0.6 and "r from replay" in copy["regime_source"]
    assert copy["speculative"] is True


def _tier_measured(precision: str, concurrency: float, engine_kv_tokens: float) -> dict[str, Any]:
    """One tier of /admin/regime with its regime measured and its engines' KV capacity."""
    return {
        "precision": precision,
        "concurrency": {"mean": concurrency},
        "rho": {"lru": 0.5},
        "r": {"r_reference": 0.6},
        "engine_kv_capacity_tokens": engine_kv_tokens,
    }


def _plans_from(admin_server: str, *options: str) -> dict[str, Any]:
    doc = _json(
        ["plan", "--from-gateway", admin_server, "--json", *options],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    return dict(doc["tiers"])


def test_plan_from_gateway_takes_the_knee_from_the_engines_kv_blocks_as_live(
    admin_server: str,
) -> None:
    """The live planner's K comes from the KV tokens the engines report (b.2 item 4); the
    CLI reads them from /admin/regime and plans with the same K."""
    _Admin.body = {"tiers": {"copy": _tier_measured("bf16", 32.0, 20 * 4096)}}
    copy = _plans_from(admin_server)["copy"]
    assert copy["knee"] == 20 and copy["b_eff"] == 20.0
    # The capacity in effect live (the gateway's configured one) wins over the engines'.
    _Admin.body["tiers"]["copy"]["kv_capacity_tokens"] = 30 * 4096
    assert _plans_from(admin_server)["copy"]["knee"] == 30
    # Reselecting compares candidates on one footing: the memory estimate for all of them.
    chosen = _plans_from(admin_server, "--reselect-precision")["copy"]
    assert chosen["knee"] == _json(["plan", "breakeven", "--json"])["knees"][chosen["precision"]]


def test_plan_from_gateway_for_another_gpu_keeps_that_gpus_knee(admin_server: str) -> None:
    """The engines' KV capacity holds on their GPU: engines on B200 (438 NVFP4 requests) must
    not give the H200 plan their knee (H200 holds 312)."""
    _Admin.body = {"hardware": "b200", "tiers": {"nv": _tier_measured("nvfp4", 400.0, 438 * 4096)}}
    assert _plans_from(admin_server, "--hardware", "b200")["nv"]["knee"] == 438
    assert _plans_from(admin_server, "--hardware", "h200")["nv"]["knee"] == 312


@pytest.mark.parametrize(
    ("yaml_text", "says"),
    [
        (
            "model: {preset: qwen3-30b-a3b, experts_per_token: 200}\n"
            "cost: {extensions: {expert_union: true}}",
            "experts_per_token must not exceed n_experts",
        ),
        (
            "model: {preset: qwen3-30b-a3b, n_active: 1.0e8}\n"
            "cost: {extensions: {effective_bytes: true}}",
            "n_embedding must not exceed n_active",
        ),
    ],
)
def test_a_model_geometry_the_cost_model_cannot_use_is_rejected_by_name(
    tmp_path: Path, yaml_text: str, says: str
) -> None:
    """Was "error: math domain error" (X1's miss rate below 0) and "error: min() arg is an
    empty sequence" (X5 streamed negative bytes, so every decode cost was negative)."""
    params = tmp_path / "params.yaml"
    params.write_text(yaml_text)
    line = _error_line(["plan", "--regime", "C=2.5,rho=0.1,r=0.3", "--params", str(params)])
    assert "invalid model" in line and says in line


@pytest.mark.parametrize(
    ("current", "says"),
    [("fp16,s=yes", "s='yes'"), ("fp16,s", "s=''"), ("fp16,x=1", "unknown flag x")],
)
def test_a_malformed_current_is_an_error_not_off(current: str, says: str) -> None:
    """`s=yes` and a bare `s` read as "not speculating", and `x=1` was ignored."""
    line = _error_line(["plan", "--regime", REGIME, "--current", current])
    assert "--current" in line and says in line
    assert _current("fp8,s=ON,k=off") == TierConfig("fp8", speculative=True, prefix_caching=False)


@pytest.mark.parametrize(
    "field", ["cost: {l_ctx: %s}", "model: {preset: qwen3-30b-a3b, n_layers: %s}"]
)
def test_an_integer_too_large_for_the_maths_is_one_line(tmp_path: Path, field: str) -> None:
    """pydantic accepts any int; float(10**400) raised OverflowError out of the command."""
    params = tmp_path / "params.yaml"
    params.write_text(field % ("1" + "0" * 400))
    for command in (["plan", "--regime", REGIME], ["plan", "breakeven"]):
        assert "too large" in _error_line([*command, "--params", str(params)])


def test_plan_from_gateway_skips_a_tier_with_a_vanishing_c_as_live(admin_server: str) -> None:
    """A window mean below the planner's floor (1e-9) is "no traffic" to the live planner;
    here it failed the whole command, and the other tiers went unplanned."""
    _Admin.body = {
        "tiers": {
            "quiet": {
                "precision": "bf16",
                "concurrency": {"mean": 1e-12},
                "rho": {"lru": 0.5},
                "r": {"r_reference": 0.3},
            },
            "busy": {
                "precision": "bf16",
                "concurrency": {"mean": 32.0},
                "rho": {"lru": 0.5},
                "r": {"r_reference": 0.3},
            },
        }
    }
    result = runner.invoke(
        app,
        ["plan", "--from-gateway", admin_server, "--json"],
        env={"TIERGATE_ADMIN_TOKEN": "s3cret"},
    )
    assert result.exit_code == 0, result.output
    assert list(json.loads(result.stdout)["tiers"]) == ["busy"]
    assert "tier quiet: no traffic in the window; skipped" in result.stderr


def test_a_trace_of_empty_prompts_plans_on_the_models_lengths(tmp_path: Path) -> None:
    """Mean lengths of 0 measure nothing: `plan --trace` stopped on "L_in must be a length
    > 0", naming neither the trace nor an option."""
    trace = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 100 * i, "input_length": 0, "output_length": 0, "hash_ids": []}
        for i in range(4)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    doc = _json(["plan", "--trace", str(trace), "--concurrency", "8", "--json"])
    tier = doc["tiers"]["default"]
    assert tier["regime"]["concurrency"] == 8
    assert tier["regime"]["l_in"] is None and tier["regime"]["l_out"] is None  # the model's
    assert tier["vllm_args"]
