from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.shadow.judges import choice_letter, final_number, judge, normalize, resolve
from gateway.shadow.labels import LabelLog

ORDER = ["choice", "number", "normalized"]


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("The answer is (B).", "B"),
        ("Answer: c", "C"),
        ("I think\nD\n", "D"),
        ("no letter here", None),
        ("answer is A, no wait, the answer is B", "B"),
    ],
)
def test_choice_letter(text: str, letter: str | None) -> None:
    assert choice_letter(text) == letter


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("so the answer is 1,000 apples", "1000"),
        ("#### 2.50", "2.5"),
        ("\\boxed{-3} then answer: 7.0", "7"),
        ("x * 2 and 7 more", None),
        ("none", None),
    ],
)
def test_final_number(text: str, value: str | None) -> None:
    assert final_number(text) == value


def test_judge_order_and_applicability() -> None:
    assert judge("The answer is A", "Answer: A", {}, ORDER, deterministic=True).adequate  # type: ignore[union-attr]
    assert judge("The answer is (b).", "Answer : B", {}, ORDER, deterministic=True).adequate  # type: ignore[union-attr]
    # Free text with numbers in it is not a numeric answer: the text judge decides.
    verdict = judge("return x * 2", "return x * 3", {}, ORDER, deterministic=True)
    assert verdict is not None and verdict.judge == "normalized" and not verdict.adequate
    verdict = judge("The answer is 41", "The answer is 42", {}, ORDER, deterministic=True)
    assert verdict is not None and not verdict.adequate and verdict.judge == "number"
    assert judge("  Hello,  World!", "hello world", {}, ORDER, deterministic=True).adequate  # type: ignore[union-attr]
    # Sampled decoding: wording differences are not evidence; only answers count.
    assert judge("hello there", "hi there", {}, ORDER, deterministic=False) is None
    assert normalize("Ｆｕｌｌ  width.") == "full width"


def test_plugin_judge_resolves_by_path() -> None:
    assert resolve("os.path:samefile") is not None
    with pytest.raises(ValueError):
        resolve("nonsense")


def test_label_log_rotates_and_keeps_the_format(tmp_path: Path) -> None:
    log = LabelLog(tmp_path / "labels.jsonl", max_bytes=400, backups=2)
    for i in range(20):
        log.append(
            {
                "id": str(i),
                "messages": [{"role": "user", "content": "q"}],
                "correct": {"nvfp4": i % 2, "bf16": 1},
                "source": "shadow:t",
            }
        )
    log.close()
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["labels.jsonl", "labels.jsonl.1", "labels.jsonl.2"]
    assert all(p.stat().st_size <= 400 for p in tmp_path.iterdir())
    last = [json.loads(line) for line in (tmp_path / "labels.jsonl").read_text().splitlines()]
    assert last[-1]["id"] == "19" and last[-1]["correct"] == {"nvfp4": 1, "bf16": 1}
