"""What one event may hold (pure): the limits that protect the process and the tables, and
the exact reading of a value's JSON. An event over a limit is a dead letter."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from connector.core.errors import DecodeError
from connector.core.ordering import INT64_MAX, INT64_MIN
from connector.core.records import MAX_TABLE_NAME_LENGTH
from iceberg.layouts import META_COLUMNS, TOMBSTONE_EXTRA

# names the state and tombstone tables give their own columns: an after-image cannot use them
RESERVED_COLUMNS = frozenset(name for name, _ in META_COLUMNS + TOMBSTONE_EXTRA)


@dataclass(frozen=True)
class DecodeLimits:
    """What one event may hold; an event over a limit is a dead letter (reason `limit`), so
    no single record can exhaust the process or the table's metadata."""

    max_depth: int = 64  # nesting of the value's JSON
    max_columns: int = 1_000  # after-image columns
    max_name_length: int = 128  # a column's name
    max_table_name_length: int = MAX_TABLE_NAME_LENGTH
    max_value_bytes: int = 16 << 20  # a record's value, before it is parsed


# A digit run that may be an integer outside the 64-bit range (20 digits, or 19 from 92...):
# orjson reads such an integer as a float. Shorter runs (a 19-digit `ts_ns`) read exactly.
_LONG_NUMBER = re.compile(rb"\d{20}|9[2-9]\d{17}")


def check_image(after: Mapping[str, Any], limits: DecodeLimits) -> None:
    """Column names a table can hold, and not too many of them (reasons `schema`, `limit`)."""
    if len(after) > limits.max_columns:
        raise DecodeError(
            "limit",
            f"the after-image has {len(after)} columns, over the limit of {limits.max_columns} (limits.max_columns)",
        )
    seen: dict[str, str] = {}
    for col in after:
        if not col or not col.strip():
            raise DecodeError("schema", "a column has an empty name")
        if len(col) > limits.max_name_length:
            raise DecodeError(
                "limit",
                f"column {col[:40]!r}... has a name of {len(col)} characters, over the limit "
                f"of {limits.max_name_length} (limits.max_name_length)",
            )
        if col in RESERVED_COLUMNS:
            raise DecodeError("schema", f"column {col!r} has the name of a metadata column of the state table")
        other = seen.setdefault(col.lower(), col)
        if other != col:
            raise DecodeError(
                "schema",
                f"columns {other!r} and {col!r} differ only in case (Spark and Iceberg "
                "resolve names case-insensitively)",
            )


def depth(doc: Any) -> int:
    """The nesting depth of a parsed JSON value (iterative: no recursion limit)."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = v.values()
        elif not isinstance(v, list):
            continue
        deepest = max(deepest, d)
        stack.extend((x, d + 1) for x in v if isinstance(x, (dict, list)))
    return deepest


def out_of_range(doc: Any) -> int | None:
    """An integer anywhere in the value outside the 64-bit range, if any."""
    stack = [doc]
    while stack:
        v = stack.pop()
        if type(v) is int and not INT64_MIN <= v <= INT64_MAX:
            return v
        if isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def parse_value(raw: bytes, limits: DecodeLimits) -> Any:
    """The value's JSON, exactly: orjson reads an integer past 64 bits as a float, so a value
    with long digit runs is read again by the standard library (exact integers; what is used
    of them is range-checked where it is used). One nested deeper than `limits.max_depth` is
    refused."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise DecodeError("json", f"value is not JSON ({e})") from None
    if _LONG_NUMBER.search(raw):
        doc = json.loads(raw)
    if raw.count(b"[") + raw.count(b"{") > limits.max_depth and depth(doc) > limits.max_depth:
        raise DecodeError("limit", f"the value is nested deeper than {limits.max_depth} levels (limits.max_depth)")
    return doc
