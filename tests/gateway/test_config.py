"""Configuration: valid files load, invalid ones name the field and exit with code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_settings, parse_settings

VALID = """
model: qwen3-30b-a3b
tiers:
  - {name: nvfp4, precision: nvfp4, endpoints: ["http://127.0.0.1:9001/v1"], served_model_name: qwen3-30b-a3b-nvfp4}
  - {name: w4a16, precision: w4a16, endpoints: ["http://127.0.0.1:9002/v1"]}
  - {name: bf16,  precision: bf16,  endpoints: ["http://127.0.0.1:9003/v1"]}
tenants:
  - {name: default, api_keys: ["sk-local-dev"]}
"""


def test_issue_example_loads(tmp_path: Path) -> None:
    path = tmp_path / "tiergate.yaml"
    path.write_text(VALID)
    settings = load_settings(path)
    assert [t.name for t in settings.tiers] == ["nvfp4", "w4a16", "bf16"]
    assert settings.tiers[1].served_model_name is None
    assert settings.tiers[0].parsed_endpoints[0].port == 9001
    assert [t.relative_cost for t in settings.tiers] == [0.25, 0.25, 1.0]


def base() -> dict[str, object]:
    return {
        "model": "m",
        "tiers": [
            {"name": "a", "precision": "nvfp4", "endpoints": ["http://127.0.0.1:1/v1"]},
            {"name": "b", "precision": "bf16", "endpoints": ["http://127.0.0.1:2/v1"]},
        ],
        "tenants": [{"name": "t", "api_keys": ["k"]}],
    }


@pytest.mark.parametrize(
    ("patch", "fragment"),
    [
        (
            {"tiers": [{"name": "a", "precision": "int3", "endpoints": ["http://x/v1"]}]},
            "tiers.0.precision",
        ),
        ({"tiers": [{"name": "a", "precision": "bf16", "endpoints": ["http://x/v1"]}]}, "tiers"),
        (
            {"tiers": [{"name": "a", "precision": "bf16", "endpoints": ["ftp://x"]}] * 2},
            "tiers.0.endpoints",
        ),
        (  # one engine twice: a trailing slash is dropped when the URL is parsed
            {
                "tiers": [
                    {
                        "name": "a",
                        "precision": "nvfp4",
                        "endpoints": ["http://x/v1", "http://x/v1/"],
                    },
                    {"name": "b", "precision": "bf16", "endpoints": ["http://y/v1"]},
                ]
            },
            "tiers.0.endpoints: Value error, endpoints must be distinct",
        ),
        (
            {"tenants": [{"name": "t", "api_keys": ["k"], "allowed_tiers": ["zzz"]}]},
            "unknown tiers",
        ),
        ({"tenants": [{"name": "t", "thresholds": {"a": 1.5}}]}, "tenants.0.thresholds.a"),
        (
            {"tenants": [{"name": "t", "thresholds": {"a": 0.5}, "alpha": 0.9}]},
            "either thresholds or alpha",
        ),
        ({"model": ""}, "model"),
        # `m@x@<tier>` was refused with a 404 that said to send just that.
        ({"model": "m@x"}, "model: Value error, must not contain '@'"),
        ({"surprise": 1}, "surprise"),
        # Infinity passes `gt=0`; it would reach Retry-After and the timers.
        ({"resilience": {"retry_after_s": float("inf")}}, "resilience.retry_after_s"),
        ({"timeouts": {"total_s": float("inf")}}, "timeouts.total_s"),
        (
            {"tenants": [{"name": "t", "limits": {"requests_per_second": float("inf")}}]},
            "tenants.0.limits.requests_per_second",
        ),
        ({"resilience": {"base_ejection_s": 100, "max_ejection_s": 1}}, "max_ejection_s"),
        (
            {"tenants": [{"name": "t", "thresholds": {"b": 0.5}}]},
            "thresholds name the top tier 'b'",
        ),
        (
            {
                "tiers": [
                    {"name": "a", "precision": "nvfp4", "endpoints": ["http://x/v1"]},
                    {
                        "name": "b",
                        "precision": "bf16",
                        "endpoints": ["http://y/v1"],
                        "served_model_name": "",
                    },
                ]
            },
            "tiers.1.served_model_name",
        ),
        (  # a dearer tier before a cheaper one: the router would try it first
            {
                "tiers": [
                    {"name": "a", "precision": "bf16", "endpoints": ["http://x/v1"]},
                    {"name": "b", "precision": "nvfp4", "endpoints": ["http://y/v1"]},
                ]
            },
            "tiers are listed cheapest first, but 'b' (cost 0.25) comes after 'a' (cost 1)",
        ),
        # A reload accepted this, then failed half applied (OverflowError building buckets).
        ({"observer": {"window_s": 1e300, "bucket_s": 1e-300}}, "observer: Value error"),
        ({"observer": {"window_s": 3600, "bucket_s": 0.01}}, "360000 buckets"),
        ({"shadow": {"window": 10**20}}, "shadow.window"),  # deque(maxlen=) overflows
        # Replays ran and were paid for, and no label could ever come of them.
        ({"shadow": {"rate": 0.5, "judges": []}}, "shadow.judges: List should have at least 1"),
    ],
)
def test_invalid_config_names_the_field(patch: dict[str, object], fragment: str) -> None:
    data = {**base(), **patch}
    with pytest.raises(ConfigError) as caught:
        parse_settings(data)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("planner", "fragment"),
    [
        ({"hardware": "tpu"}, "planner: Value error, unknown hardware 'tpu'"),
        ({"hardware": {"preset": "tpu"}}, "planner: Value error, unknown hardware 'tpu'"),
        ({"model": "llama"}, "planner: Value error, unknown model 'llama'"),
    ],
)
def test_an_unknown_planner_preset_is_a_config_error_naming_the_field(
    planner: dict[str, object], fragment: str
) -> None:
    # A KeyError escaping validation made `check` print a traceback and a reload die with it
    # (a 500 from /admin/reload, and the file watcher stopped for good).
    with pytest.raises(ConfigError) as caught:
        parse_settings({**base(), "planner": planner})
    assert fragment in str(caught.value)


def test_duplicate_names_rejected() -> None:
    data = base()
    data["tiers"] = [data["tiers"][0], data["tiers"][0]]  # type: ignore[index]
    with pytest.raises(ConfigError, match="used twice"):
        parse_settings(data)


def test_a_tier_listed_twice_in_allowed_tiers_is_refused() -> None:
    """Listed twice, a tier stood next to itself at the same cost: the router gave it
    threshold 1.0 and never chose it, and /v1/models and the attempt plan listed it twice."""
    data = base()
    data["tenants"] = [{"name": "t", "api_keys": ["k"], "allowed_tiers": ["a", "a", "b"]}]
    with pytest.raises(ConfigError, match="allowed_tiers: name 'a' is used twice"):
        parse_settings(data)


def test_serve_with_invalid_config_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(VALID.replace("precision: w4a16", "precision: w3a16"))
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "tiers.1.precision" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_with_unreadable_yaml_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("model: [unclosed")
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli.main", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 2 and "not valid YAML" in result.stderr


def test_a_yaml_error_names_the_place_without_printing_the_line(tmp_path: Path) -> None:
    # PyYAML's message quotes the line: a typo next to a key put the key in the log line of
    # the refused reload.
    from gateway.config import ConfigError, load_settings

    path = tmp_path / "typo.yaml"
    path.write_text('model: m\ntenants:\n  - {name: t, api_keys: ["sk-hunter2"}\n')
    with pytest.raises(ConfigError, match=r"not valid YAML: .*\(line 3, column \d+\)") as refused:
        load_settings(path)
    assert "hunter2" not in str(refused.value)


def test_a_field_error_names_its_line(tmp_path: Path) -> None:
    """A field error named the field's path only (tenants.1.colour), which in a long file
    left the operator counting list items; the line of the key (or list item) now follows."""
    path = tmp_path / "fields.yaml"
    path.write_text(
        "model: m\n"
        "tiers:\n"
        "  - {name: a, precision: nvfp4, endpoints: ['http://x/v1']}\n"
        "  - name: b\n"
        "    precision: bf16\n"
        "    endpoints: ['http://y/v1']\n"
        "tenants:\n"
        "  - name: t\n"
        "    limits:\n"
        "      max_concurrency: -3\n"
        "  - <<: {name: u}\n"
        "    colour: blue\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    message = str(refused.value)
    assert "tenants.0.limits.max_concurrency: Input should be greater" in message
    assert "or equal to 1 (line 10)" in message
    assert "tenants.1.colour: Extra inputs are not permitted (line 12)" in message
    # A key whose value starts on the next line is named at the key; a field missing from a
    # list item, at the item.
    path.write_text(
        "model: m\n"
        "tiers:\n"
        "  - {name: a, precision: nvfp4, endpoints: ['http://x/v1']}\n"
        "tenants:\n"
        "  - api_keys: [k]\n"
    )
    with pytest.raises(ConfigError) as refused:
        load_settings(path)
    message = str(refused.value)
    assert "tiers: List should have at least 2 items after validation, not 1 (line 2)" in message
    assert "tenants.0.name: Field required (line 5)" in message
    # An error about the whole file has no line to name.
    path.write_text("model: m\n")
    with pytest.raises(ConfigError, match=r"tiers: Field required; tenants: Field required$"):
        load_settings(path)


def test_a_config_file_that_is_not_utf8_is_a_config_error_naming_it(tmp_path: Path) -> None:
    from gateway.config import ConfigError, load_settings

    path = tmp_path / "latin1.yaml"
    path.write_bytes("model: café\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1\.yaml: not UTF-8"):
        load_settings(path)


def test_a_config_file_nested_too_deeply_is_a_config_error(tmp_path: Path) -> None:
    # PyYAML recurses per level: a RecursionError was a traceback from `check` and a reload
    # that died instead of being refused.
    path = tmp_path / "deep.yaml"
    path.write_text("model: " + "[" * 2000 + "]" * 2000 + "\n")
    with pytest.raises(ConfigError, match=r"deep\.yaml: not a configuration: nested too deeply"):
        load_settings(path)


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("http://user:hunter2@127.0.0.1:9001/v1", "must not carry a user or password"),
        # Wrong in another way too: that message printed the whole URL, password and all.
        ("http://user:hunter2@127.0.0.1:9001/v1?x=1", "must not carry a user or password"),
        ("htp://user:hunter2@127.0.0.1:9001/v1", "must not carry a user or password"),
        ("user:hunter2@127.0.0.1:9001/v1", "must be an http"),
        ("http:/user:hunter2@127.0.0.1:9001/v1", "must be an http"),
        ("http://127.0.0.1:9001/v1?key=hunter2", "must not carry a query"),
        ("http://127.0.0.1:9001/my engine/v1", "printable ASCII without spaces"),
    ],
)
def test_an_endpoint_the_gateway_could_not_call_as_written_is_refused(
    tmp_path: Path, endpoint: str, message: str
) -> None:
    """Credentials in the URL are never sent (and the URL is a /metrics label); a path
    with a space would break the upstream request line."""
    path = tmp_path / "tiergate.yaml"
    path.write_text(VALID.replace("http://127.0.0.1:9001/v1", endpoint))
    with pytest.raises(ConfigError, match=message) as refused:
        load_settings(path)
    assert "hunter2" not in str(refused.value)


def test_a_key_written_twice_in_one_mapping_is_refused_with_its_line(tmp_path: Path) -> None:
    # PyYAML keeps the last one: the first tenants block (its keys) vanished, silently.
    path = tmp_path / "tiergate.yaml"
    path.write_text(VALID + "tenants:\n  - {name: late, api_keys: [sk-late]}\n")
    with pytest.raises(ConfigError, match=r"(?s)the key 'tenants' a second time.*line 9"):
        load_settings(path)


@pytest.mark.parametrize("key", ["[a, b]: 1\n", "? {a: 1}\n: 2\n"])
def test_a_list_or_mapping_key_is_a_config_error(tmp_path: Path, key: str) -> None:
    # The duplicate-key check put every key in a set: one no set holds raised a TypeError,
    # which `check` printed as a traceback and POST /admin/reload answered with a 500.
    path = tmp_path / "tiergate.yaml"
    path.write_text(VALID + key)
    with pytest.raises(ConfigError, match="unhashable key"):
        load_settings(path)


def test_a_merged_key_may_be_overridden(tmp_path: Path) -> None:
    # `<<: *anchor` and then one of its keys again is the merge idiom, not a duplicate.
    path = tmp_path / "tiergate.yaml"
    path.write_text(
        VALID.split("tenants:", maxsplit=1)[0]
        + "tenants:\n"
        + "  - {name: a, api_keys: [sk-a], limits: &limits {requests_per_second: 5, burst: 10}}\n"
        + "  - {name: b, api_keys: [sk-b], limits: {<<: *limits, burst: 20}}\n"
    )
    limits = [tenant.limits for tenant in load_settings(path).tenants]
    assert [(x.requests_per_second, x.burst) for x in limits] == [(5, 10), (5, 20)]
