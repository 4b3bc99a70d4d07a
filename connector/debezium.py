"""Debezium decoding (pure): SourceRecord -> ChangeEvent, or DecodeError for a dead letter.

Accepts Kafka Connect JsonConverter output with `schemas.enable` true (`{"schema",
"payload"}`) and false (the bare envelope), the ExtractNewRecordState (unwrap) output
(`__op`, `__deleted`, `__source_*` fields), and null-value tombstones. Avro's JSON encoding
(unions such as `{"string": "x"}`) is rejected with reason `avro-json`: decode Avro first.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, timedelta
from decimal import Decimal, DecimalException
from functools import lru_cache, partial
from typing import Any

import orjson

from connector.core.config import Settings, TableConfig, table_settings
from connector.core.errors import DecodeError
from connector.core.ordering import INT64_MAX, INT64_MIN, is_snapshot, source_position
from connector.core.records import SOURCE_ERROR_HEADER, ChangeEvent, DeadLetter, SourceRecord, table_name, topic_table
from connector.keys import KeyFormat, canonical, key_text
from connector.limits import DecodeLimits, check_image, out_of_range, parse_value

OPS = frozenset("cudrt")
MAX_TOPICS = 10_000  # bound of the learned topic -> table map
MAX_DECIMAL_PRECISION = 38  # Spark's and Iceberg's
UNROUTABLE = "unroutable"  # the dead letters of records whose topic names no usable table
_EPOCH = datetime(1970, 1, 1)

# Kafka Connect primitive types -> Spark SQL types: the names JsonConverter writes in a
# schema (`float`, `double`: JsonSchema's FLOAT_TYPE_NAME / DOUBLE_TYPE_NAME) and Connect's
# own enum names (`float32`, `float64`), which some tools print.
_PRIMITIVE = {
    "int8": "int",
    "int16": "int",
    "int32": "int",
    "int64": "bigint",
    "float": "float",
    "double": "double",
    "float32": "float",
    "float64": "double",
    "boolean": "boolean",
    "string": "string",
    "bytes": "binary",
}


def _ts_micros(micros: int) -> str:
    return (_EPOCH + timedelta(microseconds=micros)).isoformat(sep=" ")


def _decimal(scale: int, precision: int | None) -> Callable[[Any], str]:
    """Connect's Decimal (big-endian two's complement bytes, base64 in JSON) as exact text;
    a value with more digits than the column's precision is refused, never rounded."""

    def convert(v: Any) -> str:
        raw = base64.b64decode(v, validate=True) if isinstance(v, str) else bytes(v)
        unscaled = int.from_bytes(raw, "big", signed=True)
        if precision is not None and len(str(abs(unscaled))) > precision:
            raise DecodeError("value", f"decimal {unscaled}E-{scale} has more than {precision} digits")
        return str(Decimal(unscaled).scaleb(-scale))

    return convert


def _variable_decimal(v: Any) -> str:
    return str(Decimal(int.from_bytes(base64.b64decode(v["value"]), "big", signed=True)).scaleb(-int(v["scale"])))


def _json_text(v: Any) -> str:
    return orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode()


def _field_codec(field: Mapping[str, Any]) -> tuple[str, Callable[[Any], Any]]:
    """(Spark type, converter to a castable JSON scalar) for one Connect schema field."""
    name, ftype = field.get("name"), field.get("type")
    params = field.get("parameters") or {}
    ident: Callable[[Any], Any] = lambda v: v  # noqa: E731
    if name in ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date"):
        return "date", lambda v: (date(1970, 1, 1) + timedelta(days=int(v))).isoformat()
    if name in ("io.debezium.time.Timestamp", "org.apache.kafka.connect.data.Timestamp"):
        return "timestamp_ntz", lambda v: _ts_micros(int(v) * 1000)
    if name == "io.debezium.time.MicroTimestamp":
        return "timestamp_ntz", lambda v: _ts_micros(int(v))
    if name == "io.debezium.time.NanoTimestamp":
        return "timestamp_ntz", lambda v: _ts_micros(int(v) // 1000)
    if name == "io.debezium.time.ZonedTimestamp":
        return "timestamp", ident
    if name == "org.apache.kafka.connect.data.Decimal":
        scale = int(params.get("scale", 0))
        precision = int(params.get("connect.decimal.precision", MAX_DECIMAL_PRECISION))
        if not 0 <= scale <= precision <= MAX_DECIMAL_PRECISION:
            # not a Spark / Iceberg decimal: kept exact, as text (like VariableScaleDecimal)
            return "string", _decimal(scale, None)
        return f"decimal({precision},{scale})", _decimal(scale, precision)
    if name == "io.debezium.data.VariableScaleDecimal":
        return "string", _variable_decimal
    if ftype in _PRIMITIVE:
        return _PRIMITIVE[ftype], ident
    return "string", _json_text  # struct, array, map: kept as JSON text


def _infer_type(v: Any) -> str | None:
    if v is None:
        return None
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int):
        return "bigint"
    if isinstance(v, float):
        return "double"
    return "string"


_SIGNATURES: dict[tuple[Any, ...], tuple[dict[str, str], bool]] = {}  # (columns, Python types) -> (types, nested)


def _inferred(after: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """Schemaless images: the types depend only on the columns and the values' Python types,
    so one dict per signature is shared by every event that has it (and serialised once)."""
    sig = (tuple(after), tuple(map(type, after.values())))
    hit = _SIGNATURES.get(sig)
    if hit is None:
        hit = ({c: t for c, v in after.items() if (t := _infer_type(v))}, dict in sig[1] or list in sig[1])
        if len(_SIGNATURES) < MAX_TOPICS:
            _SIGNATURES[sig] = hit
    types, nested = hit
    if nested:
        return {c: (_json_text(v) if isinstance(v, (dict, list)) else v) for c, v in after.items()}, types
    return after if type(after) is dict else dict(after), types


def _normalise(after: Mapping[str, Any], schema: Mapping[str, Any] | None) -> tuple[dict[str, Any], dict[str, str]]:
    """Values as JSON scalars castable to their Spark types, and the types themselves; a
    value its type cannot hold is a DecodeError (reason `value`) naming the column."""
    if schema is not None:
        codecs = {f["field"]: _field_codec(f) for f in schema.get("fields", []) if isinstance(f, dict)}
        values, types = {}, {}
        for col, v in after.items():
            stype, convert = codecs.get(col) or (
                _infer_type(v),
                _json_text if isinstance(v, (dict, list)) else (lambda x: x),
            )
            try:
                values[col] = None if v is None else convert(v)
            except DecodeError as e:
                raise DecodeError("value", f"column {col!r}: {e.detail}") from None
            except (ValueError, TypeError, OverflowError, ArithmeticError, DecimalException, binascii.Error) as e:
                raise DecodeError(
                    "value", f"column {col!r}: {v!r} is not a {stype} ({type(e).__name__}: {e})"
                ) from None
            if stype:
                types[col] = stype
        return values, types
    return _inferred(after)


def _after_schema(schema: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not schema:
        return None
    for f in schema.get("fields", []):
        if f.get("field") == "after":
            return dict(f)
    return None


def _reject_avro_json(payload: Mapping[str, Any], source: Any) -> None:
    ts_wrapped = type(payload.get("ts_ms")) is dict
    if not ts_wrapped and not (type(source) is dict and dict in map(type, source.values())):
        return
    wrapped = [k for k, v in (source or {}).items() if isinstance(v, dict)] + (["ts_ms"] if ts_wrapped else [])
    raise DecodeError(
        "avro-json",
        f"fields {wrapped} are Avro JSON unions; this decoder reads Kafka Connect JsonConverter "
        "output: use value.converter=org.apache.kafka.connect.json.JsonConverter or decode Avro first",
    )


def _unwrap_flattened(payload: Mapping[str, Any]) -> dict[str, Any]:
    """ExtractNewRecordState output -> an envelope (`__deleted`, `__op`, `__source_*`)."""
    row = {k: v for k, v in payload.items() if not k.startswith("__")}
    meta = {k[2:]: v for k, v in payload.items() if k.startswith("__")}
    source = {k[len("source_") :]: v for k, v in meta.items() if k.startswith("source_")}
    for name in ("lsn", "file", "pos", "row", "commit_lsn", "change_lsn", "event_serial_no", "table", "db", "snapshot"):
        if name in meta and name not in source:
            source[name] = meta[name]
    deleted = str(meta.get("deleted", "false")).lower() == "true"
    op = "d" if deleted else str(meta.get("op") or "u")
    return {
        "op": op,
        "before": row if deleted else None,
        "after": None if deleted else row,
        "source": source or None,
        "ts_ms": meta.get("ts_ms"),
    }


@lru_cache(maxsize=MAX_TOPICS)
def _source_table(text: str, max_length: int = DecodeLimits.max_table_name_length) -> str:
    return table_name(text, max_length)


class Decoder:
    """Decodes records of any number of tables.

    `key_fields` gives a table's payload fields that form its key (a map, or a function of
    the table: settings with globs and defaults); when given, the key is taken from the
    after- (or before-) image, else from the record key. The state is a bounded map topic ->
    table learned from decoded events, so a bare tombstone is routed to the table its topic
    carried, and the key fields of the tables met so far.
    """

    def __init__(
        self,
        key_fields: Mapping[str, Sequence[str]] | Callable[[str], Sequence[str]] | None = None,
        key_format: KeyFormat = "json",
        limits: DecodeLimits = DecodeLimits(),
    ):
        self._resolve = key_fields if callable(key_fields) else None
        given = {} if callable(key_fields) else (key_fields or {})
        self._key_fields = {t: tuple(f) for t, f in given.items()}  # with a function: a cache of it
        self.key_format = key_format
        self.limits = limits
        self._topic_tables: dict[str, str] = {}

    def key_fields(self, table: str) -> tuple[str, ...]:
        """The payload fields that form `table`'s key; () for the record key."""
        fields = self._key_fields.get(table)
        if fields is None:
            fields = tuple(self._resolve(table)) if self._resolve else ()
            if self._resolve and len(self._key_fields) < MAX_TOPICS:
                self._key_fields[table] = fields
        return fields

    def decode(self, record: SourceRecord) -> ChangeEvent | DeadLetter:
        """Never raises for bad input: returns a DeadLetter with the reason instead."""
        if record.headers and record.headers[0][0] == SOURCE_ERROR_HEADER:
            why = record.headers[0][1] or b""
            return DeadLetter(record, self.dead_letter_table(record.topic), "source", why.decode("utf-8", "replace"))
        try:
            return self._decode(record)
        except DecodeError as e:
            return DeadLetter(record, self.dead_letter_table(record.topic), e.reason, e.detail)
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, RecursionError) as e:
            return DeadLetter(record, self.dead_letter_table(record.topic), "envelope", f"{type(e).__name__}: {e}")

    def dead_letter_table(self, topic: str) -> str:
        """Where a topic's dead letters go: its table, or `unroutable` when it names none."""
        try:
            return self._route(topic, None)
        except DecodeError:
            return UNROUTABLE

    def topic_tables(self) -> dict[str, str]:
        """The topic -> table map learned so far (a copy)."""
        return dict(self._topic_tables)

    def learn(self, topic: str, table: str) -> None:
        """Remember the table a topic carries (the first one seen wins; bounded)."""
        if topic not in self._topic_tables and len(self._topic_tables) < MAX_TOPICS:
            self._topic_tables[topic] = table

    def _route(self, topic: str, source: Mapping[str, Any] | None) -> str:
        if source and isinstance(source.get("table"), str):
            table = _source_table(source["table"], self.limits.max_table_name_length)
            self.learn(topic, table)
            return table
        return self._topic_tables.get(topic) or topic_table(topic, self.limits.max_table_name_length)

    def _record_key(self, record: SourceRecord) -> str | None:
        return None if record.key is None else key_text(record.key, self.key_format)

    def _decode(self, record: SourceRecord) -> ChangeEvent:
        if record.value is None:
            return self._tombstone(record)
        if len(record.value) > self.limits.max_value_bytes:
            raise DecodeError(
                "limit",
                f"the value has {len(record.value):,} bytes, over the limit of "
                f"{self.limits.max_value_bytes:,} (limits.max_value_bytes)",
            )
        doc = parse_value(record.value, self.limits)
        schema = None
        if type(doc) is dict and len(doc) == 2 and "schema" in doc and "payload" in doc:
            schema, doc = doc["schema"], doc["payload"]
            if doc is None:
                return self._tombstone(record)
        if type(doc) is not dict:
            raise DecodeError("envelope", f"value is a JSON {type(doc).__name__}, not a Debezium envelope")
        if "op" not in doc:
            if not any(k.startswith("__") for k in doc):
                raise DecodeError("envelope", "no 'op' field: not a Debezium envelope nor ExtractNewRecordState output")
            doc = _unwrap_flattened(doc)
            schema = None  # the unwrapped schema describes the row itself
        source = doc.get("source")
        _reject_avro_json(doc, source)
        op = doc["op"]
        if op not in OPS:
            raise DecodeError("op", f"unsupported op {op!r} (expected one of c, u, d, r, t)")
        table = self._route(record.topic, source)
        if source is not None and type(source) is not dict:
            raise DecodeError("envelope", f"'source' is a JSON {type(source).__name__}, not an object")
        snapshot, position = is_snapshot(source, op), source_position(source)
        ts_ms = (source.get("ts_ms") if source else None) or doc.get("ts_ms")
        if ts_ms is not None and (type(ts_ms) is not int or not INT64_MIN <= ts_ms <= INT64_MAX):
            raise DecodeError("envelope", f"ts_ms = {ts_ms!r} is not an integer in the 64-bit range")
        if op == "t":
            return ChangeEvent(record, table, None, op, snapshot, False, position, ts_ms)
        if op == "d":
            return ChangeEvent(
                record, table, self._key(record, table, doc.get("before")), op, snapshot, False, position, ts_ms
            )
        after = doc.get("after")
        if type(after) is not dict:
            raise DecodeError("envelope", f"op {op!r} without an 'after' image")
        key = self._key(record, table, after)
        check_image(after, self.limits)
        big = out_of_range(after)
        if big is not None:
            raise DecodeError("value", f"integer {big} is outside the 64-bit range")
        values, types = _normalise(after, _after_schema(schema)) if schema else _inferred(after)
        return ChangeEvent(record, table, key, op, snapshot, False, position, ts_ms, values, types)

    def _key(self, record: SourceRecord, table: str, image: Mapping[str, Any] | None) -> str:
        fields = self.key_fields(table)
        if fields and image and all(f in image for f in fields):
            return canonical({f: image[f] for f in fields})
        key = self._record_key(record)
        if key is None:
            hint = f"configure tables.{table}.key_fields" if not fields else f"the image lacks {list(fields)}"
            raise DecodeError("no-key", f"no record key and no key in the payload ({hint})")
        return key

    def _tombstone(self, record: SourceRecord) -> ChangeEvent:
        key = self._record_key(record)
        if key is None:
            raise DecodeError("no-key", "tombstone without a key cannot delete anything")
        return ChangeEvent(record=record, table=self._route(record.topic, None), key=key, op="d", tombstone=True)


def decoder_for(settings: Settings) -> Decoder:
    """The decoder the settings describe: key fields, key format, limits."""
    lim = settings.limits
    limits = DecodeLimits(
        lim.max_depth, lim.max_columns, lim.max_name_length, lim.max_table_name_length, lim.max_value_bytes
    )
    # the table sections alone go to the Spark tasks with the decoder: no secret of the settings
    return Decoder(partial(_key_fields, dict(settings.tables), settings.table_defaults), settings.source.keys, limits)


def _key_fields(tables: Mapping[str, TableConfig], defaults: TableConfig, table: str) -> list[str]:
    return table_settings(tables, defaults, table).key_fields
