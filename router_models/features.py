"""Dense surface features of one request: sizes, structure, task cues, sampling parameters.

Pure functions of the `RequestView` and the word tokens of the last user turn; no model calls.
The multiple-choice block (`A. ...` lines, as in MMLU and most exam-style prompts) gets its own
features because option lengths, digits and compound options ("Both A and B", "True, False")
carry difficulty that a bag of words misses. Everything here runs on the routing hot path, so
counts use C-level string methods (`str.count`, `bytes.translate`) and set intersections with
the request's distinct words rather than one regular expression per feature.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from router_models.ngrams import clip_text, digit_token_count, tokens
from router_models.request import RequestView, view_request

__all__ = [
    "DENSE_NAMES",
    "TASK_CUES",
    "dense_features",
    "dense_features_of",
    "named_dense_features",
]

_NEGATIONS: Final = frozenset(
    ["not", "except", "least", "false", "incorrect", "never", "cannot", "untrue"]
)
# Counted on the UTF-8 bytes with a deleting bytes.translate (a C loop, ~3x faster than one
# regex scan); every character counted is ASCII, and no multi-byte UTF-8 sequence contains an
# ASCII byte, so the counts are the same as on the str.
_MATH_BYTES: Final = b"=+^*/<>|\\$"
_DIGIT_BYTES: Final = b"0123456789"
_OPTION_MARKERS: Final = ("\nA. ", "\nA) ", "\n(A) ")

# Words that name a kind of task; the router counts how many of each kind a prompt uses.
TASK_CUES: Final[Mapping[str, frozenset[str]]] = {
    "code": frozenset(
        [
            "implement",
            "refactor",
            "debug",
            "function",
            "class",
            "compile",
            "python",
            "java",
            "javascript",
            "code",
            "bug",
            "regex",
            "sql",
            "api",
            "script",
            "program",
            "algorithm",
        ]
    ),
    "proof": frozenset(["prove", "proof", "theorem", "lemma", "derive", "integral", "derivative"]),
    "transform": frozenset(
        [
            "translate",
            "summarise",
            "summarize",
            "rewrite",
            "paraphrase",
            "format",
            "convert",
            "extract",
        ]
    ),
    "explain": frozenset(
        ["explain", "why", "describe", "compare", "discuss", "analyze", "analyse"]
    ),
    "compute": frozenset(["calculate", "compute", "solve", "evaluate", "estimate", "find"]),
    "recall": frozenset(["who", "when", "where", "which", "what", "name"]),
}
# Cue words and negations share one lookup: slot `kind` counts a cue kind, the last slot
# counts negations (no word is both).
_NEGATION_SLOT: Final = len(TASK_CUES)
_WORD_SLOT: Final[Mapping[str, int]] = {
    **{word: kind for kind, cue in enumerate(TASK_CUES.values()) for word in cue},
    **dict.fromkeys(_NEGATIONS, _NEGATION_SLOT),
}
_SLOT_WORDS: Final = frozenset(_WORD_SLOT)

DENSE_NAMES: Final[tuple[str, ...]] = (
    "log_prompt_tokens",
    "log_turn_chars",
    "log_stem_chars",
    "log_system_chars",
    "n_messages",
    "n_user",
    "n_assistant",
    "log_tool_calls",
    "log_media_parts",
    "has_tools",
    "has_response_format",
    "log_max_tokens",
    "max_tokens_absent",
    "temperature",
    "n_choices",
    "is_chat",
    "code_fences",
    "math_chars_per_100",
    "numeric_tokens",
    "digits_in_options",
    "negations",
    "shouted_negation",
    "question_marks",
    "lines",
    "quotes",
    "blanks",
    "n_options",
    "option_chars_mean",
    "option_chars_max",
    "option_chars_spread",
    "compound_options",
    "statement_pair",
    "scenario_pair",
    "passage",
    "distinct_word_share",
    "chars_per_word",
    *(f"cue_{kind}" for kind in TASK_CUES),
)


def dense_features_of(request: Mapping[str, Any]) -> list[float]:
    """Dense features straight from an OpenAI request body."""
    view = view_request(request)
    return dense_features(view, tokens(view.text))


def named_dense_features(request: Mapping[str, Any]) -> dict[str, float]:
    """The dense features by name: a request's text-free record (the shadow label log's, for
    tenants whose text is not kept)."""
    values = dense_features_of(request)
    return {name: float(value) for name, value in zip(DENSE_NAMES, values, strict=True)}


def dense_features(
    view: RequestView, words: Sequence[str], distinct: Collection[str] | None = None
) -> list[float]:
    """`len(DENSE_NAMES)` floats. `words` are `ngrams.tokens(view.text)`; `distinct`, the
    same words without repeats (a dict or set), saves recomputing them when the caller has them.
    """
    if distinct is None:
        distinct = dict.fromkeys(words)
    text = clip_text(view.text)
    first_option = _first_option_at(text)
    if first_option >= 0:
        stem, block = text[:first_option], text[first_option:]
        option_chars = [len(line) - 3 for line in block.split("\n") if line[1:3] in (". ", ") ")]
    else:
        stem, block, option_chars = text, "", []
    n_options = len(option_chars)
    if n_options:
        max_option = max(option_chars)
        mean_option = sum(option_chars) / n_options
        spread = (max_option - min(option_chars)) / (mean_option + 1.0)
    else:
        max_option, mean_option, spread = 0, 0.0, 0.0
    slots = [0] * (_NEGATION_SLOT + 1)
    for word in _SLOT_WORDS.intersection(distinct):
        slots[_WORD_SLOT[word]] += 1
    n_words = len(words)
    n_text = len(text)
    raw = text.encode("utf-8", "surrogatepass")
    n_bytes = len(raw)
    # Six prompts in ten have no digit: skip the per-word isdigit scan for them. Non-ASCII
    # text may hold other Unicode digits (str.isdigit counts them), so it is always scanned.
    scan_digits = len(raw.translate(None, _DIGIT_BYTES)) != n_bytes or not text.isascii()
    max_tokens = view.max_tokens
    no_max_tokens = math.isnan(max_tokens)
    temperature = view.temperature
    # Ints and bools stay as they are (they compare and convert like floats): fewer calls.
    return [
        math.log1p(view.prompt_tokens),
        math.log1p(len(view.text)),
        math.log1p(len(stem)),
        math.log1p(len(view.system_text)),
        view.n_messages,
        view.n_user,
        view.n_assistant,
        math.log1p(view.n_tool),
        math.log1p(view.n_media),
        view.has_tools,
        view.has_response_format,
        0.0 if no_max_tokens else math.log1p(max(max_tokens, 0.0)),
        no_max_tokens,
        1.0 if math.isnan(temperature) else temperature,
        view.n_choices,
        view.is_chat,
        text.count("```") // 2,
        100.0 * (n_bytes - len(raw.translate(None, _MATH_BYTES))) / (n_text + 1.0),
        digit_token_count(text, words) if scan_digits else 0,
        _ascii_count(block, _DIGIT_BYTES) if block and scan_digits else 0,
        slots[_NEGATION_SLOT],
        "EXCEPT" in stem or " NOT " in stem,
        stem.count("?"),
        text.count("\n"),
        stem.count('"'),
        stem.count("___"),
        n_options,
        math.log1p(mean_option),
        math.log1p(max_option),
        spread,
        block.count(", ") + block.count(" and ") + block.count("of the above"),
        "Statement 1" in text,
        "Scenario 1" in text,
        len(stem) > 600 or "refers to the following" in stem,
        len(distinct) / n_words if n_words else 0.0,
        n_text / n_words if n_words else 0.0,
        *slots[:_NEGATION_SLOT],
    ]


def _ascii_count(text: str, chars: bytes) -> int:
    """Occurrences in `text` of the ASCII characters `chars` (lone surrogates pass through)."""
    raw = text.encode("utf-8", "surrogatepass")
    return len(raw) - len(raw.translate(None, chars))


def _first_option_at(text: str) -> int:
    """Offset of the first `A. ` option line, or -1 when the prompt is not multiple choice."""
    if text.startswith(("A. ", "A) ")):
        return 0
    for marker in _OPTION_MARKERS:
        at = text.find(marker)
        if at >= 0:
            return at + 1
    return -1
