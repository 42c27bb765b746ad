"""Structured output for the simulator: the JSON an answer spells under a `response_format`
of `json_object` or `json_schema`.

vLLM decodes such a request under a grammar, so its answer parses (unless max_tokens or a
stop string cuts it), and the OpenAI SDK's `parse` helpers load it into the caller's model.
The simulator keeps its filler words, and so the agreement between precisions, and puts them
in the strings of a document the schema accepts.
"""

from __future__ import annotations

from typing import Any, Final

import orjson

# Nested schemas deeper than this (a recursive `$ref`) get their emptiest value.
_MAX_DEPTH: Final = 8
_WORDS_PER_STRING: Final = 6
_COMBINATORS: Final = ("anyOf", "oneOf", "allOf")  # the first option that is not null serves
_CONSTANTS: Final[dict[Any, Any]] = {"boolean": True, "null": None}


def json_answer(response_format: Any, words: list[str]) -> str | None:
    """The JSON text an answer of `words` becomes under `response_format`; None when the
    format asks for no JSON."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return orjson.dumps({"answer": " ".join(words)}).decode()
    if kind != "json_schema":
        return None
    spec = response_format.get("json_schema")
    schema = spec.get("schema") if isinstance(spec, dict) else None
    if not isinstance(schema, dict):
        return orjson.dumps({"answer": " ".join(words)}).decode()
    return orjson.dumps(schema_instance(schema, words)).decode()


def schema_instance(schema: dict[str, Any], words: list[str]) -> Any:
    """One value `schema` accepts, its strings taken from `words` in turn."""
    return _Filler(words, schema).value(schema, 0)


class _Filler:
    """Builds one instance of a schema, taking its strings from the answer's words in turn."""

    def __init__(self, words: list[str], root: dict[str, Any]) -> None:
        self.words = words or ["answer"]
        self.root = root
        self.taken = 0

    def value(self, schema: Any, depth: int) -> Any:
        if not isinstance(schema, dict):
            return None
        schema = self._resolved(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][0]
        options = next(
            (
                schema[key]
                for key in _COMBINATORS
                if isinstance(schema.get(key), list) and schema[key]
            ),
            None,
        )
        if options is not None:
            return self.value(_first_not_null(options), depth)
        return self._typed(schema, depth)

    def _typed(self, schema: dict[str, Any], depth: int) -> Any:
        kind = schema.get("type")
        if isinstance(kind, list):
            kind = next((k for k in kind if k != "null"), "null")
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind in ("integer", "number"):
            return self._number(schema, kind)
        # A boolean or null has one value the filler can give; anything else is a string.
        if isinstance(kind, str) and kind in _CONSTANTS:  # `type` may be any JSON value
            return _CONSTANTS[kind]
        return self._string(schema)

    def _resolved(self, schema: dict[str, Any]) -> dict[str, Any]:
        ref = schema.get("$ref")
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = self.root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, dict) else None
        return target if isinstance(target, dict) else {}

    def _object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        properties = schema.get("properties")
        if not isinstance(properties, dict):
            return {}
        required = schema.get("required")
        # At the depth bound only what the schema requires: a recursive field is optional.
        names = (
            [name for name in properties if name in required]
            if depth >= _MAX_DEPTH and isinstance(required, list)
            else list(properties)
        )
        return {name: self.value(properties[name], depth + 1) for name in names}

    def _array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        least = schema.get("minItems")
        count = least if isinstance(least, int) and least > 0 else 1
        if depth >= _MAX_DEPTH and count == 1 and not isinstance(least, int):
            return []
        return [self.value(schema.get("items", {}), depth + 1) for _ in range(count)]

    def _number(self, schema: dict[str, Any], kind: str) -> float | int:
        number: float | int = len(self.words)
        low, high = schema.get("minimum"), schema.get("maximum")
        if isinstance(low, (int, float)) and number < low:
            number = low
        if isinstance(high, (int, float)) and number > high:
            number = high
        return int(number) if kind == "integer" else float(number)

    def _string(self, schema: dict[str, Any]) -> str:
        run = [self.words[(self.taken + i) % len(self.words)] for i in range(_WORDS_PER_STRING)]
        self.taken += _WORDS_PER_STRING
        text = " ".join(run)
        least = schema.get("minLength")
        if isinstance(least, int) and len(text) < least:
            text = text.ljust(least, "x")
        most = schema.get("maxLength")
        return text[:most] if isinstance(most, int) and most >= 0 else text


def _first_not_null(options: list[Any]) -> Any:
    return next(
        (o for o in options if not (isinstance(o, dict) and o.get("type") == "null")), options[0]
    )


__all__ = ["json_answer", "schema_instance"]
