"""Record keys (pure): a Debezium key's canonical text, or a text key as sent."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any, Literal

import orjson

from connector.core.errors import DecodeError


def canonical(value: Any) -> str:
    """A stable text form of a key: compact JSON with sorted fields; bare strings as-is."""
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


KeyFormat = Literal["json", "text"]


@lru_cache(maxsize=1 << 16)
def _key_text(raw: bytes) -> str | None:
    """The canonical text of a JSON record key (cached: keys repeat across a key's changes):
    an object, bare or in JsonConverter's `{"schema", "payload"}` envelope; None for a JSON
    null. Raises DecodeError (reason `key`) for anything else: Debezium keys are objects, and
    a topic keyed both `{"id":5}` and `id=5` must not hold two rows for one primary key."""
    try:
        key = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DecodeError(
            "key", f"record key is not JSON ({e}); Debezium keys are JSON objects, or set source.key_format = 'text'"
        ) from None
    if isinstance(key, dict) and len(key) == 2 and "schema" in key and "payload" in key:
        key = key["payload"]
    if key is None:
        return None
    if type(key) is not dict:
        raise DecodeError(
            "key",
            f"record key is a JSON {type(key).__name__}, not an object; Debezium keys are "
            "JSON objects, or set source.key_format = 'text'",
        )
    return canonical(key)


def _text_key(raw: bytes) -> str:
    """A text key (Event Hubs' partition key), exactly as sent."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DecodeError("key", f"record key is not UTF-8 text ({e})") from None


def key_text(raw: bytes, key_format: KeyFormat) -> str | None:
    return _key_text(raw) if key_format == "json" else _text_key(raw)


def key_text_or_none(key_format: KeyFormat) -> Callable[[bytes], str | None]:
    """`key_text` with None for a key that is not valid (the per-record route then names why)."""

    def one(raw: bytes) -> str | None:
        try:
            return key_text(raw, key_format)
        except DecodeError:
            return None

    return one
