"""JSON values on Arrow (pure): which values Arrow's JSON reader can take together, reading
them one row per value, writing struct rows back as compact JSON text, and record keys as
their canonical text (`connector.debezium._key_text`) without a Python object per value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from connector.keys import KeyFormat, key_text_or_none

_NULL_TEXT = pa.scalar(None, pa.string())
_SPARK_TYPES = {pa.int64(): "bigint", pa.float64(): "double", pa.bool_(): "boolean", pa.string(): "string"}


MAX_BRACKETS = 64  # a value with more `[` and `{` than this takes the per-record route


def json_objects(values: pa.Array, max_brackets: int = MAX_BRACKETS) -> pa.Array:
    """Per value: it may be one JSON object on one line (what `parse` takes), in valid UTF-8,
    with few enough brackets that it cannot nest deeply (Arrow's reader recurses without a
    limit: a 10,000-deep array crashes the process; the per-record route refuses it)."""
    objects = pc.and_(pc.starts_with(values, "{").fill_null(False), utf8_valid(values))
    objects = pc.and_(objects, pa.array(byte_counts(values, b"[{") <= max_brackets))
    # Arrow reads NaN and Infinity as numbers; JSON has none (the per-record route refuses them)
    data = values.buffers()[2]
    raw = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    text: bytes | None = None
    for word in (b"NaN", b"Infinity", b"\n", b"\r"):
        if not np.any(raw == word[0]):  # usually not there at all: no per-value search
            continue
        if len(word) > 1:
            text = raw.tobytes() if text is None else text
            if word not in text:
                continue
        objects = pc.and_(objects, pc.invert(pc.match_substring(values, word.decode()).fill_null(False)))
    return objects


def byte_counts(values: pa.Array, chars: bytes) -> np.ndarray:
    """Per value of a binary or string array: how many of its bytes are any of `chars` (one
    pass over the data, where `count_substring` takes one per character and is slower)."""
    n, buffers = len(values), values.buffers()
    if not n or buffers[2] is None:
        return np.zeros(n, np.int64)
    large = pa.types.is_large_binary(values.type) or pa.types.is_large_string(values.type)
    offsets = np.frombuffer(buffers[1], np.int64 if large else np.int32)[values.offset : values.offset + n + 1]
    data = np.frombuffer(buffers[2], np.uint8)[offsets[0] : offsets[-1]]
    hit = np.zeros(len(data), bool)
    for c in chars:
        hit |= data == c
    owner = np.searchsorted(offsets, np.flatnonzero(hit) + offsets[0], side="right") - 1
    return np.bincount(owner, minlength=n)[:n]


def utf8_valid(values: pa.Array) -> pa.Array:
    """Per value: valid UTF-8 (Arrow's JSON reader takes invalid bytes into its strings)."""
    try:
        values.cast(pa.string())  # validates every value at once: the usual answer is yes
        return pa.repeat(pa.scalar(True), len(values))
    except pa.ArrowInvalid:

        def valid(v: bytes | None) -> bool:
            try:
                v is None or v.decode("utf-8")
            except UnicodeDecodeError:
                return False
            return True

        return pa.array([valid(v) for v in values.to_pylist()], pa.bool_())


def mask_at(n: int, idx: pa.Array) -> pa.Array:
    """A length-n mask, true at the positions `idx`."""
    return pc.scatter(pa.repeat(pa.scalar(True), len(idx)), idx.cast(pa.int64()), max_index=n - 1).fill_null(False)


def parse(values: pa.Array) -> pa.Table | None:
    """One row per value (JSON objects without line breaks), or None when Arrow cannot
    read them all alike."""
    lines = pc.binary_join_element_wise(values, b"", b"\n")  # each value + "\n", one buffer
    data = lines.buffers()[2][: pc.sum(pc.binary_length(lines)).as_py()]  # a fresh array starts at 0
    opts = pj.ReadOptions(block_size=max(1 << 20, 2 * pc.max(pc.binary_length(values)).as_py()))
    try:
        t = pj.read_json(pa.BufferReader(data), read_options=opts)
        if any(pa.types.is_timestamp(f.type) for f in _after_fields(t)):  # Arrow read ISO text as timestamps
            t = pj.read_json(
                pa.BufferReader(data),
                read_options=opts,
                parse_options=pj.ParseOptions(explicit_schema=_no_timestamps(t.schema)),
            )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return t if t.num_rows == len(values) else None


def _after_fields(t: pa.Table) -> list[pa.Field]:
    i = t.schema.get_field_index("after")
    return list(t.schema.field(i).type) if i >= 0 and pa.types.is_struct(t.schema.field(i).type) else []


def _no_timestamps(schema: pa.Schema) -> pa.Schema:
    def fix(t: pa.DataType) -> pa.DataType:
        if pa.types.is_timestamp(t):
            return pa.string()
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, fix(f.type)) for f in t])
        return t

    return pa.schema([pa.field(f.name, fix(f.type)) for f in schema])


# A key that is already its own canonical text: one field, an int or a printable ASCII string.
_CANONICAL_KEY = r'^\{"[A-Za-z_][A-Za-z0-9_]*":(0|-?[1-9][0-9]{0,17}|"[ !#-\[\]-~]*")\}$'


def key_texts(keys: pa.Array, key_format: KeyFormat = "json") -> pa.Array:
    """`debezium.key_text` of every key, null where a key is not valid: JSON keys already
    canonical as they are; JSON objects of non-null ints, strings and booleans as sorted
    compact JSON built by Arrow; any other key one distinct value at a time."""
    if key_format == "text":
        return mapped(keys, key_text_or_none("text"))
    n = len(keys)
    ok = pc.match_substring_regex(keys, _CANONICAL_KEY).fill_null(False)
    texts = pc.replace_with_mask(pa.nulls(n, pa.string()), ok, keys.filter(ok).cast(pa.string()))
    cand = pc.and_(json_objects(keys), pc.invert(ok))
    if pc.any(cand).as_py():
        idx = pc.indices_nonzero(cand)
        t = parse(keys.filter(cand))
        if (
            t is not None
            and t.num_columns
            and "payload" not in t.schema.names
            and all(f.type in (pa.int64(), pa.string(), pa.bool_()) for f in t.schema)
        ):
            struct = pa.StructArray.from_arrays([c.combine_chunks() for c in t.columns], names=t.schema.names)
            text, _, bad = after_json(struct)
            good = pc.invert(bad)
            for c in t.columns:  # a null field is kept by the canonical form, left out by Arrow's
                good = pc.and_(good, pc.is_valid(c.combine_chunks()))
            parsed = mask_at(n, idx.filter(good))
            texts = pc.replace_with_mask(texts, parsed, text.filter(good))
            ok = pc.or_(ok, parsed)
    rest = pc.invert(ok)
    if pc.any(rest).as_py():
        texts = pc.replace_with_mask(texts, rest, mapped(keys.filter(rest), key_text_or_none("json")))
    return texts


def mapped(values: pa.Array, fn: Callable[[Any], str | None]) -> pa.Array:
    """`fn` applied once per distinct value (None for nulls) -> a string array, row for row."""
    distinct = pc.unique(values)
    images = pa.array([None if v is None else fn(v) for v in distinct.to_pylist()], pa.string())
    return images.take(pc.index_in(values, distinct))


def after_json(after: pa.StructArray) -> tuple[pa.Array, pa.Array, pa.Array]:
    """Per row: the after-image as JSON text (null columns left out), its types as JSON text
    with sorted keys (null when no column has a value), and whether the row must take the
    slow route (an integral float, a string with a control character)."""
    n = len(after)
    bad = pa.repeat(pa.scalar(False), n)
    columns = []  # (name as JSON, column, value text without quotes, quoted, Spark type)
    for i, f in sorted(enumerate(after.type), key=lambda x: x[1].name):
        if f.type == pa.null():
            continue
        col = pc.struct_field(after, [i])  # null where the after-image is null, too
        if f.type == pa.string():
            text = col
            if pc.any(pc.match_substring_regex(col, r'[\x00-\x1f"\\]')).as_py():  # rare: escape
                bad = pc.or_kleene(bad, pc.match_substring_regex(col, r"[\x00-\x1f]").fill_null(False))
                text = pc.replace_substring(pc.replace_substring(col, "\\", "\\\\"), '"', '\\"')
        else:
            if f.type == pa.float64():  # integral (5.0 reads as 5 elsewhere) or not finite (NaN is not JSON)
                integral = pc.equal(pc.floor(col), col).fill_null(False)
                bad = pc.or_kleene(bad, pc.or_(integral, pc.invert(pc.is_finite(col).fill_null(True))))
            text = col.cast(pa.string())
        columns.append((orjson.dumps(f.name).decode(), col, text, f.type == pa.string(), _SPARK_TYPES[f.type]))
    if not columns:
        return pa.repeat(pa.scalar("{}"), n), pa.nulls(n, pa.string()), bad
    if all(c[1].null_count == after.null_count for c in columns):
        # Nulls only where the whole after-image is null (the usual case): one join writes each
        # row's object, and the types are one text for every row.
        parts, close = [], ""
        for k, (name, _, text, quoted, _) in enumerate(columns):
            q = '"' if quoted else ""
            parts += [close + ("{" if k == 0 else ",") + name + ":" + q, text]
            close = q
        after_text = pc.binary_join_element_wise(*parts, close + "}", "")
        one_type = "{" + ",".join(f'{name}:"{spark}"' for name, *_, spark in columns) + "}"
        return after_text, pc.if_else(pc.is_valid(after), one_type, _NULL_TEXT), bad
    values, types = [], []
    for name, col, text, quoted, spark in columns:
        if quoted:
            text = pc.binary_join_element_wise('"', text, '"', "")
        values.append(pc.binary_join_element_wise(name + ":", text, ",", "").fill_null(""))
        types.append(pc.if_else(pc.is_valid(col), f'{name}:"{spark}",', ""))
    # Each fragment ends with a comma, the last one is cut. (Arrow 26's null_handling="skip"
    # returned fewer rows than it was given here, so nulls are emptied instead.)
    body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*values, ""), 0, -1)
    type_body = pc.utf8_slice_codeunits(pc.binary_join_element_wise(*types, ""), 0, -1)
    after_text = pc.binary_join_element_wise("{", body, "}", "")
    types_text = pc.if_else(pc.equal(type_body, ""), _NULL_TEXT, pc.binary_join_element_wise("{", type_body, "}", ""))
    return after_text, types_text, bad


__all__ = ["after_json", "json_objects", "key_texts", "mapped", "mask_at", "parse"]
