"""The compiled build (setup.py, TIERGATE_COMPILE=1) gives the source's answers, bit for bit.

Builds the package once with mypyc into a temporary directory (about a minute), then runs the
same requests through it in a subprocess and through the source here: tokens, dense features,
scores and calibrated probabilities must be equal, for the shipped linear model and a trained
gradient-boosted one. In CI a missing compiler is a failure, not a skip.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from router_models import router_build
from router_models.features import dense_features_of
from router_models.model import RouterModel, default_model_path
from router_models.ngrams import tokens
from router_models.request import view_request
from tests.helpers import REPO, require_binary

pytestmark = pytest.mark.slow

EDGE_CASES: list[dict[str, Any]] = [
    {"messages": [{"role": "user", "content": ""}]},
    {"messages": []},
    {"prompt": "Prove that x^2 >= 0 for every real x. Show each step.", "max_tokens": 0},
    {"prompt": ["first part", 17, [1, 2, 3]], "n": 3, "temperature": 1.5},
    {"prompt": [[5, 6], [7]]},
    {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": [{"type": "text", "text": "Décris ½ café — vite…"}]},
            {"role": "assistant", "content": None, "tool_calls": [{"id": "a"}, {"id": "b"}]},
            {"role": "tool", "content": "42"},
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "response_format": {"type": "json_object"},
        "max_completion_tokens": 64,
    },
    {"messages": [{"role": "user", "content": "٣ + ² = ? \ud800 EXCEPT NOT «this»"}]},
    {"messages": [{"role": "user", "content": "```python\ndef f(x):\n    return x\n```\n" * 400}]},
    {"messages": [{"role": "user", "content": "Which one?\nA. 1, 2\nB) both of the above\n"}]},
    {"messages": "not a list", "max_tokens": "many", "temperature": None, "n": True},
]

PROBE = """
import json, sys
import router_models
from router_models.features import dense_features_of
from router_models.model import RouterModel
from router_models.ngrams import tokens
from router_models.request import view_request
requests = json.load(open(sys.argv[1]))
out = {"build": router_models.router_build(), "models": {}}
for path in sys.argv[3:]:
    model = RouterModel.load(path)
    out["models"][path] = [
        [model.score_one(r), list(model.predict_proba_one(r))] for r in requests
    ]
out["tokens"] = [tokens(view_request(r).text) for r in requests]
out["dense"] = [dense_features_of(r) for r in requests]
json.dump(out, open(sys.argv[2], "w"))
"""


def probe_here(requests: list[dict[str, Any]], model_paths: list[str]) -> dict[str, Any]:
    """What PROBE computes, from the source modules of this process."""
    models = {}
    for path in model_paths:
        model = RouterModel.load(path)
        models[path] = [[model.score_one(r), list(model.predict_proba_one(r))] for r in requests]
    return {
        "build": router_build(),
        "models": models,
        "tokens": [tokens(view_request(r).text) for r in requests],
        "dense": [dense_features_of(r) for r in requests],
    }


def sample_requests(shared_data: Path) -> list[dict[str, Any]]:
    mmlu = shared_data / "labels" / "mmlu_mixtral_vs_gpt4.jsonl.gz"
    with gzip.open(mmlu, "rt", encoding="utf-8") as handle:
        rows = [json.loads(line) for _, line in zip(range(400), handle, strict=False)]
    chats = json.loads(
        (shared_data / "traces" / "sharegpt" / "ShareGPT_V3_filtered_1000.json").read_text()
    )
    roles = {"human": "user", "gpt": "assistant"}
    sharegpt = [
        {
            "messages": [
                {"role": roles.get(t["from"], "user"), "content": t["value"]}
                for t in chat["conversations"]
            ],
            "temperature": 0.7,
        }
        for chat in chats[:200]
    ]
    return [{"messages": r["messages"], "max_tokens": 16} for r in rows] + sharegpt + EDGE_CASES


def test_compiled_build_matches_the_source(
    tmp_path: Path, shared_data: Path, gbdt_model: RouterModel
) -> None:
    require_binary("gcc")
    assert router_build() == "python"  # the editable install never carries compiled modules
    # A clean copy of the sources: an in-tree build reuses whatever an earlier build left in
    # build/, which could hide a module that setup.py no longer compiles.
    source_tree = tmp_path / "src"
    for name in ("pyproject.toml", "setup.py", "README.md"):
        source_tree.mkdir(exist_ok=True)
        shutil.copy2(REPO / name, source_tree / name)
    for package in ("gateway", "router_models"):
        shutil.copytree(
            REPO / package, source_tree / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    target = tmp_path / "site"
    build = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source_tree),
        ],
        env={**os.environ, "TIERGATE_COMPILE": "1"},
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    assert list((target / "router_models").glob("features.*.so"))

    requests = sample_requests(shared_data)
    (tmp_path / "requests.json").write_text(json.dumps(requests))
    gbdt_path = str(gbdt_model.save(tmp_path / "gbdt"))
    model_paths = [str(default_model_path()), gbdt_path]
    # Outside the repository, so the compiled copy (first on PYTHONPATH) is what imports.
    run = subprocess.run(
        [sys.executable, "-c", PROBE, "requests.json", "out.json", *model_paths],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    compiled = json.loads((tmp_path / "out.json").read_text())
    source = json.loads(json.dumps(probe_here(requests, model_paths)))  # same float round trip

    assert compiled["build"] == "mypyc" and source["build"] == "python"
    assert compiled["tokens"] == source["tokens"]
    assert compiled["dense"] == source["dense"]
    for path in model_paths:
        assert compiled["models"][path] == source["models"][path], path
