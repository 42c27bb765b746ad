"""Dense features and hashed grams: values on known prompts, determinism across processes."""

from __future__ import annotations

import os
import subprocess
import sys
import zlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from router_models.features import DENSE_NAMES, dense_features_of
from router_models.model import RouterModel, default_model_path
from router_models.ngrams import (
    _SEPARATORS,
    CHAR_SALT,
    HEAD_CHARS,
    TAIL_CHARS,
    GramSpec,
    char_gram_buckets,
    char_grams,
    clip_text,
    gram_bucket,
    tokens,
)
from router_models.vectorize import featurize

MMLU_LIKE = (
    "All of the following are social movements inspired by the Civil Rights movement EXCEPT\n"
    "A. women's rights\nB. gay and lesbian rights\nC. states' rights\nD. Native American rights\n"
    "Answer:"
)


def named(request: dict[str, object]) -> dict[str, float]:
    return dict(zip(DENSE_NAMES, dense_features_of(request), strict=True))


def test_multiple_choice_structure() -> None:
    f = named({"messages": [{"role": "user", "content": MMLU_LIKE}]})
    assert f["n_options"] == 4
    assert f["shouted_negation"] == 1.0
    assert f["negations"] == 1.0  # "except" once, counted among distinct words
    assert f["option_chars_max"] == np.log1p(len("Native American rights"))
    assert f["compound_options"] == 1.0  # "gay and lesbian rights"
    assert f["is_chat"] == 1.0 and f["n_user"] == 1.0


def test_code_math_and_cues() -> None:
    text = "Please refactor this function and prove x^2 >= 0:\n```python\ndef f(x): return x*x\n```"
    f = named({"prompt": text, "max_tokens": 100})
    assert f["code_fences"] == 1.0
    assert f["cue_code"] >= 2.0  # refactor, function
    assert f["cue_proof"] == 1.0
    assert f["math_chars_per_100"] > 0
    assert f["max_tokens_absent"] == 0.0 and f["log_max_tokens"] == np.log1p(100)
    assert f["is_chat"] == 0.0 and f["n_options"] == 0.0


def test_long_prompts_are_clipped_to_head_and_tail() -> None:
    text = "a " * 20_000 + "zebra"
    clipped = clip_text(text)
    assert len(clipped) == HEAD_CHARS + TAIL_CHARS + 1
    assert clipped.endswith("zebra")
    assert "zebra" in tokens(text)


def test_featurize_rows_are_normalised_by_distinct_words() -> None:
    spec = GramSpec(bigram_weight=0.0, char_weight=0.0)
    feats = featurize([{"prompt": "alpha beta beta gamma"}, {"prompt": ""}], spec)
    row = feats.grams.getrow(0).toarray().ravel()
    assert np.count_nonzero(row) == 3
    np.testing.assert_allclose(row[row != 0], 1 / np.sqrt(3))
    assert feats.grams.getrow(1).nnz == 0
    assert feats.dense.shape == (2, len(DENSE_NAMES))


def test_buckets_do_not_depend_on_the_process_hash_seed() -> None:
    here = [gram_bucket(g, 7, (1 << 18) - 1) for g in ("alpha", "beta gamma", "ünï")]
    code = (
        "from router_models.ngrams import gram_bucket;"
        "print([gram_bucket(g, 7, (1 << 18) - 1) for g in ('alpha', 'beta gamma', 'ünï')])"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == str(here)


@given(
    st.text(
        alphabet=st.sampled_from(
            "aZ_9 .,!?=$\n\t\u00e9\u00c4\u0130\u00df\u2013\u201c\u2022\u00a0\u4e2d\ud800"
            "\u0663\u00b2"  # non-ASCII digits: str.isdigit counts them
        ),
        max_size=60,
    )
)
def test_tokens_match_the_reference_translation(text: str) -> None:
    # The fast paths (byte tables, ASCII and UTF-8) give exactly the tokens of the plain
    # definition: lower-case, punctuation and typographic separators to spaces, split.
    assert tokens(text) == text.lower().translate(_SEPARATORS).split()
    # The dense features read the same text (lone surrogates included) without failing.
    f = named({"messages": [{"role": "user", "content": text}]})
    assert f["math_chars_per_100"] == 100.0 * sum(map(text.count, "=$")) / (len(text) + 1.0)
    # Digit-free ASCII text skips the per-token scan; every other text gets the plain count.
    assert f["numeric_tokens"] == sum(map(str.isdigit, tokens(text)))


def test_character_counts_are_the_same_on_non_ascii_text() -> None:
    text = "Soit f(x) = x² + 3·x; évaluer f(2) = 10 ≥ 9\nA. 10 €\nB. 12\nC. 1/2\nD. 3"
    f = named({"messages": [{"role": "user", "content": text}]})
    math_chars = sum(text.count(c) for c in "=+^*/<>|\\$")
    assert f["math_chars_per_100"] == 100.0 * math_chars / (len(text) + 1.0)
    block = text[text.index("A. ") :]
    assert f["digits_in_options"] == sum(c in "0123456789" for c in block)
    assert f["negations"] == 0.0


def test_lone_surrogates_are_hashed_not_fatal() -> None:
    # The json module (label files) accepts a lone surrogate; training and the one-request path
    # hash it like any other character and agree with each other.
    request = {"messages": [{"role": "user", "content": "caf\ud800 au lait \ud800"}]}
    assert gram_bucket("\ud800", 0, 255) == zlib.crc32(b"\xed\xa0\x80") & 255
    model = RouterModel.load(default_model_path())
    np.testing.assert_allclose(
        model.predict_proba([request])[0], model.predict_proba_one(request), atol=1e-12
    )


@given(st.text(min_size=1, max_size=24), st.sampled_from([(1, 3), (3, 5), (2, 2)]))
def test_char_gram_buckets_hash_every_gram_as_the_reference(
    word: str, bounds: tuple[int, int]
) -> None:
    """The byte-slice path for ASCII words is only a faster way to the same buckets."""
    low, high = bounds
    mask = (1 << 18) - 1
    reference = [gram_bucket(g, CHAR_SALT, mask) for g in char_grams(word, low, high)]
    assert char_gram_buckets(word, low, high, mask) == reference
    ascii_word = word.encode("ascii", "replace").decode()  # the byte-slice path
    ascii_reference = [gram_bucket(g, CHAR_SALT, mask) for g in char_grams(ascii_word, low, high)]
    assert char_gram_buckets(ascii_word, low, high, mask) == ascii_reference
