from __future__ import annotations

import json
import os
import re
import unicodedata
from collections.abc import Mapping
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config import ConfigError, default_settings, parse_settings
from gateway.shadow.judges import (
    Verdict,
    choice,
    choice_letter,
    final_numbers,
    judge,
    normalize,
    number,
    resolve,
)
from gateway.shadow.labels import LabelLog, check_label_log_path

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
    ("text", "letter"),
    [
        # After "the answer is", a lower-case "a" is the article, not option A.
        ("The answer is a total of 45 apples.", None),
        ("The answer is D, and that answer is a safe bet.", "D"),
        ("The answer is B. I am sure this answer is a good one.", "B"),
        ("The answer is I think B", None),  # the pronoun: no clear letter
        ("The answer is (c), surely", "C"),
        ("The answer is a.", "A"),
        ("Answer is: E", "E"),
    ],
)
def test_choice_letter_reads_only_clear_letters(text: str, letter: str | None) -> None:
    assert choice_letter(text) == letter


@pytest.mark.parametrize(
    ("candidate", "reference", "adequate", "by"),
    [
        ("The answer is D, and that answer is a safe bet.", "The answer is A.", False, "choice"),
        (
            "The answer is B. I am sure this answer is a good one.",
            "The answer is B.",
            True,
            "choice",
        ),
    ],
)
def test_choice_judge_on_articles_and_restatements(
    candidate: str, reference: str, adequate: bool, by: str
) -> None:
    verdict = judge(candidate, reference, {}, ORDER, deterministic=False)
    assert verdict is not None and (verdict.adequate, verdict.judge) == (adequate, by)


def test_a_reference_without_a_clear_letter_falls_through() -> None:
    reference = "The answer is a total of 45 apples."
    assert judge("The answer is A.", reference, {}, ORDER, deterministic=False) is None
    verdict = judge("The answer is A.", reference, {}, ORDER, deterministic=True)
    assert verdict is not None and verdict.judge == "normalized" and not verdict.adequate


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("so the answer is 1,000 apples", (1000,)),
        ("#### 2.50", (Fraction(5, 2),)),
        ("\\boxed{-3} then answer: 7.0", (7,)),
        ("x * 2 and 7 more", None),
        ("none", None),
        ("The answer is 3/5.", (Fraction(3, 5),)),
        ("\\boxed{\\frac{3}{4}}", (Fraction(3, 4),)),
        ("The answer is 1, 5, 7.", (1, 5, 7)),
        ("The answer is 1, 5 and 7", (1, 5, 7)),
        ("The answer is 45 apples, 3 more than 42.", (45,)),
        ("answer: 2^10", (1024,)),
        ("\\boxed{2^{10}}", (1024,)),
        ("answer: 1.5e3", (1500,)),
        ("The answer is 1.5 x 10^6", (1_500_000,)),
        ("The answer is 12345678901234567891", (12345678901234567891,)),
        ("The answer is \u22125", (-5,)),
        ("The answer is 2x + 3", None),  # an expression, not a number
        ("The answer is 9^999999", None),  # too large to compare
        ("The answer is 1/0", None),
    ],
)
def test_final_numbers_are_exact(text: str, values: tuple[Fraction, ...] | None) -> None:
    assert final_numbers(text) == values


@pytest.mark.parametrize(
    ("candidate", "reference"),
    [
        ("The answer is 3/5", "The answer is 3/4"),
        ("The answer is 1, 5, 7", "The answer is 1, 2, 3"),
        ("The answer is 2^10", "The answer is 2^5"),
        ("The answer is 1.5e3", "The answer is 1.5e6"),
        ("The answer is 12345678901234567890", "The answer is 12345678901234567891"),
        ("The answer is -5", "The answer is 5"),
    ],
)
def test_number_judge_tells_different_answers_apart(candidate: str, reference: str) -> None:
    verdict = judge(candidate, reference, {}, ORDER, deterministic=False)
    assert verdict is not None and verdict.judge == "number" and not verdict.adequate
    same = judge(reference, reference.replace("is", "is:"), {}, ORDER, deterministic=False)
    assert same is not None and same.adequate


def test_normalized_text_keeps_the_minus_sign() -> None:
    assert normalize("x = -5") == "x = -5" and normalize("-5") == "-5"
    assert normalize("state-of-the-art, 1-5") == "state of the art 1 5"
    for candidate, reference in (("-5", "5"), ("x = -5", "x = 5")):
        verdict = judge(candidate, reference, {}, ORDER, deterministic=True)
        assert verdict is not None and verdict.judge == "normalized" and not verdict.adequate


def same_length(candidate: str, reference: str, request: Mapping[str, Any]) -> Verdict:
    """A plug-in judge for the tests."""
    return len(candidate) == len(reference)


def test_plugin_judges_decide_stochastic_pairs() -> None:
    order = [*ORDER, f"{__name__}:same_length"]
    verdict = judge("hello there", "hi there", {}, order, deterministic=False)
    assert verdict is not None and verdict.judge == order[-1] and not verdict.adequate


@pytest.mark.parametrize(
    ("judges", "message"),
    [
        (["choise"], "unknown judge 'choise'"),
        (["no_such_module_xyz:judge"], "cannot import 'no_such_module_xyz'"),
        (["os.path:no_such_function"], "has no 'no_such_function'"),
        (["os:sep"], "is not callable"),
    ],
)
def test_unknown_judges_are_refused_when_the_config_is_parsed(
    judges: list[str], message: str
) -> None:
    data = default_settings().model_dump(mode="json")
    data["shadow"]["judges"] = judges
    with pytest.raises(ConfigError, match=f"shadow.judges: .*{message}"):
        parse_settings(data)
    data["shadow"]["judges"] = ["choice", f"{__name__}:same_length"]
    assert parse_settings(data).shadow.judges == data["shadow"]["judges"]


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


def test_label_logs_of_several_workers_share_one_rotation(tmp_path: Path) -> None:
    """`serve --workers N`: every worker appends to the same file and any may rotate it. A
    worker that labels seldom must not write into a backup, nor into one rotated away."""
    path = tmp_path / "labels.jsonl"
    busy, quiet = (LabelLog(path, max_bytes=1000, backups=3) for _ in range(2))
    quiet.append({"id": "quiet-first"})
    for i in range(150):  # enough for more rotations than there are backups
        busy.append({"id": str(i), "pad": "x" * 30})
    quiet.append({"id": "quiet-second"})
    for log in (busy, quiet):
        log.close()
    current = [json.loads(line)["id"] for line in path.read_text().splitlines()]
    assert current[-1] == "quiet-second"
    # Each rotation moved a full file: the two writers kept as much as one would.
    backups = sorted(tmp_path.glob("labels.jsonl.*"))
    assert len(backups) == 3 and all(p.stat().st_size > 900 for p in backups)


def test_label_log_without_backups_truncates_instead_of_growing(tmp_path: Path) -> None:
    path = tmp_path / "labels.jsonl"
    log = LabelLog(path, max_bytes=4096, backups=0)
    for i in range(1000):
        log.append({"id": str(i), "correct": {"nvfp4": 1, "bf16": 1}})
    log.close()
    assert [p.name for p in tmp_path.iterdir()] == ["labels.jsonl"]
    assert 0 < path.stat().st_size <= 4096
    assert json.loads(path.read_text().splitlines()[-1])["id"] == "999"


def test_label_log_files_are_readable_by_their_owner_alone(tmp_path: Path) -> None:
    # Lines may hold tenants' prompts: a file created under umask 022 was world-readable,
    # and so was every file a rotation started.
    path = tmp_path / "labels.jsonl"
    previous = os.umask(0o022)
    try:
        log = LabelLog(path, max_bytes=4096, backups=1)
        for _ in range(100):
            log.append({"request": {"prompt": "x" * 100}})
        log.close()
    finally:
        os.umask(previous)
    rotated = path.with_name("labels.jsonl.1")
    assert rotated.exists()
    assert [oct(p.stat().st_mode & 0o777) for p in (path, rotated)] == ["0o600", "0o600"]


def test_checking_a_label_log_path_creates_nothing(tmp_path: Path) -> None:
    """`check_label_log_path` says what `LabelLog` would meet, and leaves no trace."""
    check_label_log_path(tmp_path / "new" / "deeper" / "labels.jsonl")  # LabelLog makes dirs
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "labels.jsonl").write_text("")
    check_label_log_path(tmp_path / "labels.jsonl")  # an existing file is appended to
    (tmp_path / "a-file").write_text("")
    with pytest.raises(NotADirectoryError, match="a-file is not a directory"):
        check_label_log_path(tmp_path / "a-file" / "sub" / "labels.jsonl")
    with pytest.raises(IsADirectoryError, match="is a directory"):
        check_label_log_path(tmp_path)
    check_label_log_path(Path(os.devnull))  # LabelLog appends to a device as well
    (tmp_path / "link").symlink_to(tmp_path / "a-file" / "target")  # dangling, unreachable
    with pytest.raises(NotADirectoryError):
        check_label_log_path(tmp_path / "link")
    with pytest.raises(OSError):
        LabelLog(tmp_path / "link")
    with pytest.raises(OSError):  # the same paths that LabelLog itself refuses
        LabelLog(tmp_path / "a-file" / "sub" / "labels.jsonl")
    with pytest.raises(OSError):
        LabelLog(tmp_path)


def test_answer_level_judges_read_the_start_and_the_end_of_a_long_answer() -> None:
    """Judging runs on the event loop: a long answer is read at its first and last 4 KB,
    where answers state their result ("The answer is B." then an explanation, or reasoning
    then the answer), and runs of spaces cannot make a search backtrack (50,000 spaces
    after a number took 8 s before the patterns were made unambiguous)."""
    explanation = "Option B is correct because the mitochondria make ATP. " * 200
    assert choice("The answer is B.\n\n" + explanation, "The answer is B.", {})
    assert choice("B\n\n" + explanation, "The answer is B.", {})
    assert number("#### 42\n\n" + explanation, "#### 42", {})
    assert final_numbers(explanation + "The answer is 1, 5 and 7") == (1, 5, 7)
    assert final_numbers(explanation + "The answer is 7. " + explanation) is None  # mid-text
    assert final_numbers("The answer is 1" + " " * 4_000 + "and") == (1,)
    assert choice_letter("Let me think. The answer is" + "\n" * 4_000) is None


@pytest.mark.parametrize(
    ("candidate", "reference", "adequate"),
    [
        ("The final answer is 5cm.", "The final answer is 5 cm.", True),
        ("The answer is 12kg", "The answer is 12 kg", True),
        ("The answer is 7th", "The answer is 7", True),
        ("The answer is 3:45", "The answer is 3:30", None),  # a time is not one number
        ("The answer is 1.2.4", "The answer is 1.2.3", None),  # nor a version
        ("The answer is 2x + 5", "The answer is 2x + 3", None),  # nor an expression
        ("The answer is 42 - the others are wrong.", "The answer is 42.", True),
        ("\\boxed{\\frac12}", "\\boxed{\\frac{1}{2}}", True),
        ("\\boxed{\\tfrac{1}{2}}", "\\boxed{\\frac{1}{2}}", True),
    ],
)
def test_numbers_with_units_fractions_and_what_is_not_one_number(
    candidate: str, reference: str, adequate: bool | None
) -> None:
    verdict = number(candidate, reference, {})
    assert verdict is adequate or (adequate is None and verdict is None)


@pytest.mark.parametrize(
    ("candidate", "reference", "adequate"),
    [
        ("The answer is b, because the others are wrong.", "The answer is B.", True),
        ("The answer is c since c is larger.", "The answer is C.", True),
        ("The answer is a total of 45 apples.", "The answer is A.", False),
        ("The answer is e.g. the first one.", "The answer is E.", False),
    ],
)
def test_lower_case_letters_other_than_a_and_i_are_options(
    candidate: str, reference: str, adequate: bool
) -> None:
    assert choice(candidate, reference, {}) is adequate


@given(st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=60))
def test_normalize_is_its_plain_definition(text: str) -> None:
    """The translate-table normalisation equals the per-character definition."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    signs = {match.start() for match in re.finditer(r"(?<!\w)[-\u2212](?=\d)", folded)}
    stripped = "".join(
        "-" if i in signs else " " if unicodedata.category(ch).startswith("P") else ch
        for i, ch in enumerate(folded)
    )
    assert normalize(text) == re.sub(r"\s+", " ", stripped).strip()
