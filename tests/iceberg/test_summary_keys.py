"""The commit contract (`iceberg.summary_keys`): every `cdclake.*` snapshot-summary key is
spelled in that module only, each codec round-trips to the exact text commits hold, and the
registry's rules hang together (markers, what rebuild keeps, the walk back through the
ancestry). No Spark."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from connector.core.ordering import Truncate
from iceberg import summary_keys as sk

ROOT = Path(__file__).parents[2]
LITERAL = re.compile(r"""["'](cdclake\.[^"'{\s]*)""")
# `cdclake.` strings of the product that are not summary keys
NOT_SUMMARY_KEYS = {
    ("connector/core/records.py", "cdclake.source-error"),  # SOURCE_ERROR_HEADER, a Kafka header
    ("connector/demo.py", "cdclake.toml"),  # the demo's configuration file
    ("connector/sources/file.py", "cdclake.file."),  # a file source's stream name
    ("iceberg/spark.py", "cdclake.LocalFileIO"),  # a Java class (infra/delta-writer)
    ("iceberg/compat_spark.py", "cdclake."),  # the package of those Java classes
}


def test_summary_keys_are_spelled_in_the_registry_only():
    found = {
        (path.relative_to(ROOT).as_posix(), m.group(1))
        for package in ("connector", "iceberg", "quotas")
        for path in sorted((ROOT / package).rglob("*.py"))
        for m in LITERAL.finditer(path.read_text())
    }
    registry = {(path, name) for path, name in found if path == "iceberg/summary_keys.py"}
    assert found - registry - NOT_SUMMARY_KEYS == set()
    assert {name for _, name in registry} == {k.name for k in sk.KEYS}  # each defined there, once each
    assert len({k.name for k in sk.KEYS}) == len(sk.KEYS)


TRUNCATE = Truncate("db.s.things", 2, "41", 17, 1_700_000_000_123_456, (5, 9), True, 1_700_000_000_000)
# (key, value, its text in a snapshot summary): the wire format is pinned, since tables
# written by earlier versions hold it
CASES: list[tuple[sk.SummaryKey[Any], Any, str]] = [
    (sk.POSITIONS, {"t:1": 7, "t:0": 12}, '{"t:0":12,"t:1":7}'),
    (sk.POSITIONS, {}, "{}"),
    (sk.WRITER, "ingest on host pid 42", "ingest on host pid 42"),
    (sk.CLEANER_POINTS, {"db.s.things:0": 3, "a:0": 0}, '{"a:0":0,"db.s.things:0":3}'),
    (sk.STREAM_BYTES, {"t:0": 1 << 40}, '{"t:0":1099511627776}'),
    (
        sk.TRUNCATE,
        TRUNCATE,
        '{"enqueued_us":1700000000123456,"offset":"41","partition":2,"position":[5,9],'
        '"sequence_number":17,"snapshot":true,"source_ts_ms":1700000000000,"topic":"db.s.things"}',
    ),
    (
        sk.TRUNCATE,
        Truncate("t", 0, "3", 3, 0),
        '{"enqueued_us":0,"offset":"3","partition":0,"position":null,"sequence_number":3,'
        '"snapshot":false,"source_ts_ms":null,"topic":"t"}',
    ),
    (sk.ORDERING, "log", "log"),
    (sk.ORDERING, "source", "source"),
    (sk.ROUND_RANGES, {"t:1": [5, 9], "t:0": [0, 4]}, '{"t:1":[5,9],"t:0":[0,4]}'),  # the round's order kept
    (
        sk.STALE_REASONS,
        {"older_than_state": 1, "older_than_truncate": 2},
        '{"older_than_state":1,"older_than_truncate":2}',
    ),
    (sk.TRIMMED_BEFORE, datetime(2030, 1, 1, 4, 30, tzinfo=UTC), "2030-01-01T04:30:00+00:00"),
    (sk.EXPIRES_FROM, datetime(2030, 1, 2, 4, 30, 0, 5, tzinfo=UTC), "2030-01-02T04:30:00.000005+00:00"),
    (sk.EXPIRES_FROM, sk.NEVER, "9999-12-31T23:59:59.999999+00:00"),
    (sk.LOG_SEEN, 6004071938446419107, "6004071938446419107"),
    (sk.DIRTY, {}, "{}"),
    (
        sk.DIRTY,
        {"t:1": [4, 9, 5, 600, 1700000000000000, 1700000003600000]},
        '{"t:1":[4,9,5,600,1700000000000000,1700000003600000]}',
    ),
    (
        sk.APPENDED,
        {"t:0": [12, 15, 3, 420, 1700000000000000, 1700000000002000]},
        '{"t:0":[12,15,3,420,1700000000000000,1700000000002000]}',
    ),
    (
        sk.TRIMMED_BEFORE,
        datetime(2030, 1, 1, 4, 30, 0, 12, tzinfo=timezone(timedelta(hours=2))),
        "2030-01-01T04:30:00.000012+02:00",
    ),
]


@pytest.mark.parametrize("key, value, text", CASES, ids=[f"{k.name}-{i}" for i, (k, _, _) in enumerate(CASES)])
def test_each_codec_round_trips_to_the_text_commits_hold(key, value, text):
    assert key.entry(value) == {key.name: text}
    assert key.decode(text) == value
    assert key.encode(key.decode(text)) == text


def test_every_key_has_a_codec_case():
    assert {k.name for k, _, _ in CASES} == {k.name for k in sk.KEYS}


def test_each_table_marker_is_a_carried_key_of_that_table():
    assert set(sk.MARKERS) == {"log", "dead_letters", "state", "tombstones"}
    for kind, marker in sk.MARKERS.items():
        assert marker.carried and kind in marker.tables and marker in sk.KEYS
    for key in sk.KEYS:  # a carried key is on a table whose marker expiry keeps
        assert not key.carried or key.tables <= set(sk.MARKERS), key.name


def test_rebuild_keeps_the_state_s_round_record_and_the_bytes():
    kept = {kind: {k.name for k in sk.KEYS if k.rebuild_keeps and kind in k.tables} for kind in sk.MARKERS}
    assert kept == {
        "log": set(),
        "dead_letters": set(),
        "state": {"cdclake.cleaner-points", "cdclake.truncate", "cdclake.ordering", "cdclake.stream-bytes"},
        "tombstones": {"cdclake.stream-bytes", "cdclake.expires-from"},
    }


class _Table:
    """The part of a pyiceberg table the readers use: snapshots by id, each with its summary's
    properties and its parent (`None` props: a snapshot without a summary)."""

    def __init__(self, *props: dict[str, str] | None):
        self.snapshots = {
            i: SimpleNamespace(
                snapshot_id=i,
                parent_snapshot_id=i - 1 if i > 1 else None,
                summary=SimpleNamespace(additional_properties=p) if p is not None else None,
            )
            for i, p in enumerate(props, 1)
        }

    def current_snapshot(self):
        return self.snapshots.get(len(self.snapshots))

    def snapshot_by_id(self, snapshot_id):
        return self.snapshots.get(snapshot_id)


def test_a_value_is_read_from_the_newest_snapshot_of_the_ancestry_that_has_it():
    round_commit = {**sk.CLEANER_POINTS.entry({"t:0": 4}), **sk.ORDERING.entry("log")}
    rewrite = {"total-records": "3"}  # a maintenance commit: none of the product's keys
    state = _Table(sk.CLEANER_POINTS.entry({"t:0": 2}), round_commit, rewrite, None)
    assert sk.CLEANER_POINTS.read(state) == {"t:0": 4}
    assert sk.CLEANER_POINTS.read(state, snapshot_id=1) == {"t:0": 2}  # as of an older snapshot
    assert sk.ORDERING.read(state) == "log" and sk.TRUNCATE.read(state) is None
    assert sk.CLEANER_POINTS.of(state.current_snapshot()) is None and sk.ORDERING.of(state.snapshots[2]) == "log"
    assert sk.CLEANER_POINTS.held_by(state.snapshots[2]) and not sk.CLEANER_POINTS.held_by(state.snapshots[3])
    del state.snapshots[1]  # expired: the walk ends at the missing parent
    assert sk.TRUNCATE.read(state) is None
    assert sk.rebuild_entries(state, "state") == round_commit  # what rebuild copies: the keys it keeps
    assert sk.rebuild_entries(state, "tombstones") == {}


def test_the_writer_is_that_of_the_newest_commit_that_moved_the_positions():
    log = _Table(
        {**sk.POSITIONS.entry({"t:0": 5}), **sk.WRITER.entry("ingest a")},
        sk.WRITER.entry("ingest b"),  # a commit of nothing: no positions
    )
    assert sk.WRITER.read(log) == "ingest b"
    assert sk.WRITER.read(log, with_key=sk.POSITIONS) == "ingest a"
    assert _Table().current_snapshot() is None and sk.POSITIONS.read(_Table()) is None
