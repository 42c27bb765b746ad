"""Stop strings cut the simulated answer where vLLM would: before the earliest match."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.sim.stops import cut_at_stop

WORDS = st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), max_size=8)


def test_a_match_inside_a_word_keeps_the_text_before_it() -> None:
    pieces = ["the", "quick", "brown", "fox"]
    assert cut_at_stop(pieces, ["ick b"]) == (["the", "qu"], "ick b")
    assert cut_at_stop(pieces, ["brown"]) == (["the", "quick", ""], "brown")  # "the quick "
    assert cut_at_stop(pieces, ["zzz", ""]) == (pieces, None)


@given(WORDS, st.lists(st.text(alphabet="abc ", min_size=1, max_size=3), max_size=3))
def test_the_text_is_everything_before_the_earliest_stop(
    pieces: list[str], stops: list[str]
) -> None:
    text = " ".join(pieces)
    kept, matched = cut_at_stop(pieces, stops)
    found = [(text.find(s), s) for s in stops if s in text]
    if not found:
        assert (kept, matched) == (pieces, None)
        return
    at = min(position for position, _ in found)
    assert " ".join(kept) == text[:at]
    assert matched is not None and text.find(matched) == at
