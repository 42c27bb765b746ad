"""Label files: both formats, and one clear error with file and line for every defect."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from router_models.data import load_labels, parse_tiers
from router_models.errors import LabelDataError
from router_models.labels import adequacy, difficulty

GOOD = {"id": "a", "messages": [{"role": "user", "content": "hi"}], "correct": {"x": 1, "y": 0.5}}


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_reads_plain_and_gzip(tmp_path: Path) -> None:
    plain = write(tmp_path / "a.jsonl", [json.dumps(GOOD), "", json.dumps({**GOOD, "id": "b"})])
    packed = tmp_path / "b.jsonl.gz"
    with gzip.open(packed, "wt") as handle:
        handle.write(json.dumps({**GOOD, "correct": {"y": 1, "x": None}}) + "\n")
    labels = load_labels([plain, packed], ["x", "y"])
    assert labels.tiers == ("x", "y") and len(labels) == 3
    assert np.isnan(labels.correct[2, 0]) and labels.correct[2, 1] == 1.0
    assert labels.files == {str(plain): 2, str(packed): 1}
    assert "correct" not in labels.requests[0] and "messages" in labels.requests[0]


@pytest.mark.parametrize("name", ["upper.JSONL.GZ", "packed.jsonl"])
def test_gzip_is_read_whatever_the_name_says(tmp_path: Path, name: str) -> None:
    """A gzip file named `.GZ` or `.jsonl` was read as text: "not UTF-8 text" on line 1."""
    packed = tmp_path / name
    with gzip.open(packed, "wt") as handle:
        handle.write(json.dumps(GOOD) + "\n")
    assert len(load_labels([packed], ["x", "y"])) == 1


def test_a_byte_order_mark_leading_the_file_is_read_past(tmp_path: Path) -> None:
    """Windows tools start UTF-8 files with one; it was "invalid JSON" on line 1. Anywhere
    else it is no mark but a stray character, and still refused."""
    marked = tmp_path / "marked.jsonl"
    marked.write_bytes(b"\xef\xbb\xbf" + (json.dumps(GOOD) + "\n").encode() * 2)
    assert len(load_labels([marked], ["x", "y"])) == 2
    stray = tmp_path / "stray.jsonl"
    stray.write_bytes(
        (json.dumps(GOOD) + "\n").encode() + b"\xef\xbb\xbf" + json.dumps(GOOD).encode()
    )
    with pytest.raises(LabelDataError, match=r"stray\.jsonl:2: invalid JSON"):
        load_labels([stray], ["x", "y"])


def test_ladder_defaults_to_the_first_rows_order(tmp_path: Path) -> None:
    assert load_labels([write(tmp_path / "a.jsonl", [json.dumps(GOOD)])]).tiers == ("x", "y")


@pytest.mark.parametrize(
    ("lines", "line", "fragment"),
    [
        ([json.dumps(GOOD), "{not json"], 2, "invalid JSON"),
        ([json.dumps(GOOD), "[1, 2]"], 2, "JSON object"),
        # Beyond the parser's recursion limit, and an integer past Python's digit limit.
        ([json.dumps(GOOD), "[" * 100_000 + "]" * 100_000], 2, "invalid JSON"),
        (
            [json.dumps(GOOD), json.dumps(GOOD)[:-1] + ', "n": ' + "1" * 5000 + "}"],
            2,
            "invalid JSON",
        ),
        ([json.dumps({**GOOD, "correct": {"x": 1}})], 1, "tier(s) y missing"),
        ([json.dumps({**GOOD, "correct": {"x": 1.5, "y": 1}})], 1, "outside [0, 1]"),
        # An integer score too large for a float: not float()'s OverflowError.
        ([json.dumps({**GOOD, "correct": {"x": 10**400, "y": 1}})], 1, "outside [0, 1]"),
        ([json.dumps({**GOOD, "correct": {"x": "yes", "y": 1}})], 1, "not a number"),
        ([json.dumps({"correct": {"x": 1, "y": 1}})], 1, "neither 'messages' nor 'prompt'"),
        ([json.dumps({**GOOD, "messages": "hi"})], 1, "list of objects"),
        (
            [json.dumps(GOOD), json.dumps({k: v for k, v in GOOD.items() if k != "correct"})],
            2,
            "missing 'correct'",
        ),
        # Present but not an object: it was reported as missing.
        ([json.dumps(GOOD), json.dumps({**GOOD, "correct": [1, 0]})], 2, "got a JSON array"),
    ],
)
def test_malformed_rows_name_file_and_line(
    tmp_path: Path, lines: list[str], line: int, fragment: str
) -> None:
    path = write(tmp_path / "bad.jsonl", lines)
    with pytest.raises(LabelDataError) as info:
        load_labels([path], ["x", "y"])
    assert info.value.line == line
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert fragment in str(info.value)


def test_wrong_tier_names(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", [json.dumps(GOOD)])
    with pytest.raises(LabelDataError, match=r"a.jsonl:1: tier\(s\) fp16 missing .*has: x, y"):
        load_labels([path], ["x", "fp16"])


def test_a_ladder_read_from_the_first_row_holds_for_every_row(tmp_path: Path) -> None:
    # Without --tiers the first row sets the ladder; a tier only a later row has is not
    # dropped silently (with --tiers, choosing a subset is the point).
    wider = {**GOOD, "correct": {"x": 1, "z": 0, "y": 1}}
    path = write(tmp_path / "a.jsonl", [json.dumps(GOOD), json.dumps(wider)])
    with pytest.raises(LabelDataError) as info:
        load_labels([path])
    assert str(info.value) == (
        f"{path}:2: tier(s) z are not in the ladder read from a.jsonl:1 (x, y); "
        "pass --tiers to choose the ladder"
    )
    assert load_labels([path], ["x", "y"]).tiers == ("x", "y")


def test_a_pipe_is_read_whole_not_sniffed_for_gzip(tmp_path: Path) -> None:
    """A pipe (`<(cat ...)`) is never sniffed: the bytes read to look would be lost (and a
    second open would wait for a writer that has gone)."""
    import os
    import threading

    pipe = tmp_path / "rows.jsonl"
    os.mkfifo(pipe)
    read: list[int] = []

    def feed() -> None:
        pipe.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "b"}) + "\n")

    def load() -> None:
        read.append(len(load_labels([pipe], ["x", "y"])))

    threading.Thread(target=feed, daemon=True).start()
    reader = threading.Thread(target=load, daemon=True)
    reader.start()
    reader.join(5.0)
    assert read == [2]


def test_empty_missing_and_corrupt_files(tmp_path: Path) -> None:
    with pytest.raises(LabelDataError, match="empty file"):
        load_labels([write(tmp_path / "e.jsonl", [""])], ["x", "y"])
    with pytest.raises(LabelDataError, match="no such file"):
        load_labels([tmp_path / "none.jsonl"], ["x", "y"])
    with pytest.raises(LabelDataError, match="is a directory"):
        load_labels([tmp_path], ["x", "y"])
    # A device or a pipe is read like a file: /dev/null is simply empty.
    with pytest.raises(LabelDataError, match="empty file"):
        load_labels([Path("/dev/null")], ["x", "y"])
    bad = tmp_path / "c.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(LabelDataError, match="cannot read"):
        load_labels([bad], ["x", "y"])


def test_rows_with_only_features_are_skipped_and_counted(tmp_path: Path) -> None:
    features_only = {"id": "f", "correct": {"x": 0, "y": 1}, "features": {"prompt_tokens": 3}}
    path = write(tmp_path / "shadow.jsonl", [json.dumps(features_only), json.dumps(GOOD)])
    labels = load_labels([path])
    assert len(labels) == 1 and labels.ids == ("a",) and labels.skipped_without_text == 1
    with pytest.raises(LabelDataError, match="no rows with request text"):
        load_labels([write(tmp_path / "only.jsonl", [json.dumps(features_only)])])


def test_parse_tiers() -> None:
    assert parse_tiers(" a, b ,c") == ("a", "b", "c")
    for bad in ("a", "a,,b", "a,a"):
        with pytest.raises(ValueError):
            parse_tiers(bad)


def test_relative_and_absolute_labels() -> None:
    correct = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0], [0.0, 0.0, 0.0], [np.nan, 1.0, 1.0]])
    rel = adequacy(correct)
    np.testing.assert_array_equal(rel[:3], [[1, 0], [0, 1], [1, 1]])
    assert np.isnan(rel[3, 0]) and rel[3, 1] == 1.0
    np.testing.assert_array_equal(adequacy(correct, "absolute")[:3], correct[:3])
    np.testing.assert_allclose(difficulty(correct)[:3], [0.5, 0.5, 0.0])
    assert difficulty(np.array([[1.0, 0.0]]))[0] == -1.0


@pytest.mark.parametrize("bad_line", [4, 300])
def test_invalid_utf8_names_its_own_line(tmp_path: Path, bad_line: int) -> None:
    """Decoding ran ahead in 8 KB chunks: a bad byte on line 4 was reported on line 1, one on
    line 300 on line 296."""
    lines = [json.dumps({**GOOD, "id": str(i), "pad": "x" * 100}).encode() for i in range(400)]
    lines[bad_line - 1] = lines[bad_line - 1].replace(b"hi", b"h\xff")
    for name, opener in (("p.jsonl", open), ("p.jsonl.gz", gzip.open)):
        path = tmp_path / name
        with opener(path, "wb") as handle:
            handle.write(b"\n".join(lines) + b"\n")
        with pytest.raises(LabelDataError, match=f":{bad_line}: not UTF-8"):
            load_labels([path], ["x", "y"])
