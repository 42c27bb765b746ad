"""Stop strings end the simulated answer where vLLM's detokenizer ends it: at the token that
completes the earliest-completing stop string, the text cut before it (or after it)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gateway.sim.stops import cut_at_stop, spaced_texts

WORDS = st.lists(st.text(alphabet="abc ", min_size=1, max_size=4), max_size=8)
TEXTS = spaced_texts(["the", "quick", "brown", "fox"])  # "the quick brown fox"


def test_a_match_inside_a_word_keeps_the_text_before_it() -> None:
    cut = cut_at_stop(TEXTS, ["ick b"])
    assert ("".join(cut.texts), cut.stop) == ("the qu", "ick b")
    brown = cut_at_stop(TEXTS, ["brown"])
    assert "".join(brown.texts) == "the quick "
    assert cut_at_stop(TEXTS, ["zzz", ""]).texts == TEXTS
    assert cut_at_stop(TEXTS, ["zzz", ""]).stop is None


def test_every_token_up_to_the_one_that_completes_the_stop_is_generated() -> None:
    # "ick bro" starts in "quick" and is only complete once " brown" is generated
    cut = cut_at_stop(TEXTS, ["ick bro"])
    assert cut.tokens == 3
    assert cut.texts == ["the", " qu", ""]  # the tokens after the cut add no text


def test_include_stop_keeps_the_stop_string_and_cuts_the_rest_of_its_token() -> None:
    cut = cut_at_stop(TEXTS, ["ick bro"], include_stop=True)
    assert ("".join(cut.texts), cut.tokens) == ("the quick bro", 3)


def test_the_stop_that_completes_first_wins() -> None:
    # "quick brown" begins first, "ick" ends first: vLLM stops at "ick"
    cut = cut_at_stop(TEXTS, ["quick brown", "ick"])
    assert (cut.stop, "".join(cut.texts), cut.tokens) == ("ick", "the qu", 2)


@given(WORDS, st.lists(st.text(alphabet="abc ", min_size=1, max_size=3), max_size=3), st.booleans())
def test_the_text_ends_at_the_earliest_completed_stop(
    pieces: list[str], stops: list[str], include: bool
) -> None:
    texts = spaced_texts(pieces)
    text = "".join(texts)
    cut = cut_at_stop(texts, stops, include_stop=include)
    found = [(text.find(s) + len(s), s) for s in stops if s in text]
    if not found:
        assert (cut.texts, cut.stop) == (texts, None)
        return
    end = min(position for position, _ in found)
    assert cut.stop is not None and text.find(cut.stop) + len(cut.stop) == end
    at = end - len(cut.stop)
    assert "".join(cut.texts) == text[: end if include else at]
    # generated: exactly the tokens needed to spell the text through the stop string
    assert len("".join(texts[: cut.tokens])) >= end > len("".join(texts[: cut.tokens - 1]))
