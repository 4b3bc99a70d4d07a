import json
from datetime import UTC
from pathlib import Path

import pyarrow as pa
import pytest

from connector.batch import RecordBatch
from connector.core.config import load_settings
from connector.core.errors import ConfigError, SourceError
from connector.sources.file import FileSource, plan_ranges, read_range


def file_records(path, **options):
    """Every record of a dump, read range by range as the executors read it."""
    batch = RecordBatch(pa.concat_tables([read_range(r, **options) for r in plan_ranges(path)]))
    return batch.records(list(range(len(batch))))


def test_environment_overrides_file_and_errors_name_the_key(tmp_path, monkeypatch):
    cfg = tmp_path / "c.toml"
    cfg.write_text('[compaction]\ntombstone_retention_hours = 12\n[tables.orders]\nkey_fields = ["order_id"]\n')
    assert load_settings(cfg).compaction.tombstone_retention_hours == 12
    assert load_settings(cfg).table("orders").key_fields == ["order_id"]
    monkeypatch.setenv("CDCLAKE_COMPACTION__TOMBSTONE_RETENTION_HOURS", "48")
    assert load_settings(cfg).compaction.tombstone_retention_hours == 48
    monkeypatch.setenv("CDCLAKE_COMPACTION__MIN_CLEANABLE_DIRTY_RATIO", "2")
    with pytest.raises(ConfigError, match="compaction.min_cleanable_dirty_ratio"):
        load_settings(cfg)
    cfg.write_text("[compaction]\ntombstone_retention = 1\n")
    monkeypatch.delenv("CDCLAKE_COMPACTION__MIN_CLEANABLE_DIRTY_RATIO")
    with pytest.raises(ConfigError, match="compaction.tombstone_retention"):
        load_settings(cfg)


def test_file_source_reads_kcat_and_event_hubs_fields_and_seeks(tmp_path):
    f = tmp_path / "dump.jsonl"
    f.write_text(
        "\n".join(
            json.dumps(x)
            for x in [
                {
                    "topic": "a.b.c",
                    "partition": 1,
                    "offset": 7,
                    "ts": 1700000000000,
                    "key": "k",
                    "payload": None,
                    "headers": ["h1", "v1", "h2", None],
                },
                {
                    "topic": "a.b.c",
                    "partition": 1,
                    "offset": "4294967296",
                    "sequence_number": 8,
                    "partition_key": "pk",
                    "enqueued_time": "2024-05-01T10:00:00Z",
                    "key": "ignored",
                    "payload": "{}",
                },
            ]
        )
        + "\n"
    )
    a, b = file_records(f)
    assert a.value is None and a.headers == (("h1", b"v1"), ("h2", None)) and a.sequence_number == 7
    assert b.key == b"pk" and b.offset == "4294967296" and b.sequence_number == 8 and b.enqueued_time.year == 2024


BAD_LINES = [
    b"not json",
    b'{"topic": "db.s.things", "partition": 0, "off',
    b"[1,2,3]",
    b"42",
    b"null",
    b'{"topic": "db.s.things", "partition": 0, "offset": -1, "payload": "{}"}',
    b'{"topic": "db.s.things", "partition": 1099511627776, "offset": 3, "payload": "{}"}',
    b'{"topic": "db.s.things", "partition": 0, "offset": 3, "ts": 100000000000000000000, "payload": "{}"}',
    b'{"topic": "db.s.things", "partition": 0, "offset": 99999999999999999999, "payload": "{}"}',
    b'{"topic": 7, "partition": 0, "offset": 3, "payload": "{}"}',
    b"\xff\xfe garbage",
]


@pytest.mark.spark
@pytest.mark.parametrize("batch", [3, 1000])  # 3: bad lines alone in a batch, and beside good ones
def test_a_line_that_is_not_a_record_is_a_dead_letter_and_the_stream_goes_on(spark, settings, tmp_path, batch):
    """Each bad line is a dead letter of the file's own stream (offset: its line number,
    value: the line's bytes, reason `source`); every good record before and after it is in
    the log, and a rerun adds nothing."""
    from connector.debezium import Decoder
    from connector.pipeline import IngestJob, ingest
    from iceberg.catalog import load_catalog

    def good(i):
        value = json.dumps(
            {"op": "c", "after": {"id": i}, "source": {"connector": "postgresql", "table": "things", "lsn": i}}
        )
        return json.dumps(
            {
                "topic": "db.s.things",
                "partition": 0,
                "offset": i,
                "ts": 1_700_000_000_000,
                "key": json.dumps({"id": i}),
                "payload": value,
            }
        ).encode()

    lines = [good(0), good(1)] + BAD_LINES + [good(2)]
    f = tmp_path / "dump.jsonl"
    f.write_bytes(b"\n".join(lines) + b"\n")
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    for _ in range(2):
        ingest(spark, FileSource(f), IngestJob(catalog, ns, Decoder(), batch))
    log = catalog.load_table((ns, "things__log")).scan().to_arrow()
    assert sorted(log["sequence_number"].to_pylist()) == [0, 1, 2]
    dead = catalog.load_table((ns, "dump__dead_letters")).scan().to_arrow().to_pylist()
    assert sorted(((d["topic"], d["offset"], d["reason"], d["value"]) for d in dead), key=lambda d: int(d[1])) == [
        ("cdclake.file.dump", str(n), "source", line) for n, line in enumerate(lines, 1) if line in BAD_LINES
    ]
    assert all("dump.jsonl:" in d["detail"] for d in dead)


def test_file_source_needs_its_file(tmp_path):
    with pytest.raises(SourceError, match="no such file"):
        FileSource(tmp_path / "missing.jsonl")


@pytest.mark.parametrize(
    "starting,expected",
    [
        ("earliest", 10),
        ("latest", 20),
        (15, 15),
        (3, 10),
        (99, 20),
        ("time", 17),
    ],
)
def test_initial_position_of_a_partition_without_a_committed_position(starting, expected):
    from datetime import datetime

    from connector.sources import initial_position

    when = datetime(2024, 1, 1, tzinfo=UTC)
    looked_up = []
    got = initial_position(when if starting == "time" else starting, 10, 20, lambda t: looked_up.append(t) or 17)
    assert got == expected and looked_up == ([when] if starting == "time" else [])


@pytest.mark.parametrize(
    "toml,env,says",
    [
        ("a = [\n", {}, "is not valid TOML"),
        (b"\xff\xfe = 1\n", {}, "is not valid TOML in UTF-8"),
        ("", {"CDCLAKE_SOURCE": "{bad"}, "CDCLAKE_* environment"),
        ("", {"CDCLAKE_SOURCES__PATH": "x"}, "unknown environment variable CDCLAKE_SOURCES__PATH"),
        ('[catalog]\nuri = "foo://x"\n', {}, "catalog.uri"),
        ('[spark]\nmaster = "bogus"\n', {}, "spark.master"),
        ('[spark]\ndriver_memory = "lots"\n', {}, "spark.driver_memory"),
        (
            "",
            {"CDCLAKE_WORK_DIR": "/proc/cdclake-cannot-be-here"},
            "work_dir '/proc/cdclake-cannot-be-here' cannot be ",
        ),
    ],
)
def test_a_configuration_error_is_one_line_naming_it_and_exit_code_2(tmp_path, monkeypatch, toml, env, says):
    from typer.testing import CliRunner

    from connector.cli import app

    cfg = tmp_path / "c.toml"
    (cfg.write_bytes if isinstance(toml, bytes) else cfg.write_text)(toml)
    monkeypatch.chdir(tmp_path)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    result = CliRunner().invoke(app, ["status", "--config", str(cfg)])
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0], result.output


@pytest.mark.parametrize("args,short", [(["ingest"], True), (["run"], True), (["run", "--every", "60"], False)])
def test_one_command_starts_a_short_lived_driver_and_a_job_that_stays_up_a_long_lived_one(tmp_path, args, short):
    """A command that runs once and exits gives the driver JVM it starts the options of a short
    life (the JVM's first compiler alone); `run --every` does not. Said before the settings
    are read: here they fail, and no session starts."""
    from typer.testing import CliRunner

    from connector.cli import app
    from iceberg.spark import SHORT_LIVED_OPTIONS, driver_conf

    cfg = tmp_path / "c.toml"
    cfg.write_text("a = [\n")
    result = CliRunner().invoke(app, [*args, "--config", str(cfg)])
    assert result.exit_code == 2 and "is not valid TOML" in result.output, result.output
    jars = tmp_path / "jars"  # the driver's options need no real jars
    jars.mkdir()
    for name in ("cdclake-delta-writer.jar", "iceberg-spark-runtime-x.jar"):
        (jars / name).write_bytes(b"")
    options = driver_conf(load_settings(work_dir=tmp_path, spark={"jars_dir": str(jars)}))
    options = options["spark.driver.extraJavaOptions"]
    assert (SHORT_LIVED_OPTIONS in options.split()) is short, options


def test_a_line_over_the_sources_limit_is_not_parsed(tmp_path):
    f = tmp_path / "dump.jsonl"
    f.write_text('{"topic": "t", "partition": 0, "offset": 0, "payload": "' + "x" * 500 + '"}\n')
    (r,) = file_records(f, max_line_bytes=100)
    assert r.topic == "cdclake.file.dump" and r.offset == "1" and b"over the file source's limit" in r.headers[0][1]


@pytest.mark.parametrize(
    "source,says",
    [
        (
            {"type": "file", "bootstrap_servers": "b:9092"},
            "source.file.bootstrap_servers: Extra inputs are not permitted",
        ),
        ({"type": "kafka", "topics": ["t"]}, "source.kafka.bootstrap_servers: Field required"),
        ({"type": "kafka", "bootstrap_servers": "b:9092", "topics": ["t"], "event_hub": "h"}, "source.kafka.event_hub"),
        (
            {"type": "eventhubs-kafka", "namespace": "n", "topics": ["t"], "connection_string": "x"},
            "not an Event Hubs connection string",
        ),
        (
            {"type": "eventhubs", "connection_string": "Endpoint=sb://n/;SharedAccessKey=k", "topics": ["t"]},
            "source.eventhubs.topics: Extra inputs",
        ),
        ({"type": "bogus"}, "'bogus'"),
    ],
)
def test_source_keys_must_apply_to_the_chosen_source(source, says):
    with pytest.raises(ConfigError) as e:
        load_settings(source=source)
    assert says in str(e.value)


def test_a_source_without_a_type_is_the_file_source(monkeypatch):
    monkeypatch.setenv("CDCLAKE_SOURCE__PATH", "dump.jsonl")
    s = load_settings()
    assert (s.source.type, s.source.path) == ("file", "dump.jsonl")


@pytest.mark.parametrize("max_lines", [None, 1, 2, 5])
@pytest.mark.parametrize("target_bytes", [1, 7, 64, 1 << 20])
@pytest.mark.parametrize("tail", [b"", b"\n", b"\n\n"])
def test_file_ranges_cover_the_file_at_line_ends(tmp_path, max_lines, target_bytes, tail):
    from connector.sources.file import plan_ranges

    lines = [b"a" * (i % 5) for i in range(23)]  # blank lines too: they count
    f = tmp_path / "dump.jsonl"
    f.write_bytes(b"\n".join(lines) + tail)
    ranges = plan_ranges(f, max_lines, target_bytes)
    data = f.read_bytes()
    assert b"".join(data[r.start : r.end] for r in ranges) == data
    assert all(a.end == b.start for a, b in zip(ranges, ranges[1:]))
    numbered = [(r.first_line + i, line) for r in ranges for i, line in enumerate(data[r.start : r.end].splitlines())]
    assert numbered == list(enumerate(data.splitlines(), 1))  # each range knows its first line's number
    assert all(r.lines == len(data[r.start : r.end].splitlines()) for r in ranges)
    assert max_lines is None or all(r.lines <= max_lines for r in ranges)


@pytest.mark.spark
@pytest.mark.parametrize("name", ["dir", "glob"])
def test_a_directory_or_a_glob_of_dumps_is_read_file_by_file(spark, settings, tmp_path, name):
    from connector.debezium import Decoder
    from connector.pipeline import IngestJob, ingest
    from iceberg.catalog import load_catalog
    from tests.conftest import kcat_lines

    values = [json.dumps({"op": "c", "after": {"id": i}, "source": {"table": "things", "lsn": i}}) for i in range(9)]
    lines = kcat_lines("db.s.things", values, [{"id": i} for i in range(9)])
    d = tmp_path / "dumps"
    d.mkdir()
    for i in range(3):  # one topic's offsets 0-2, 3-5, 6-8 in three files
        (d / f"part-{i}.jsonl").write_text("\n".join(lines[3 * i : 3 * i + 3]) + "\n")
    (d / "part-1.jsonl").write_text((d / "part-1.jsonl").read_text() + "not a record\n")
    path = d if name == "dir" else d / "part-*.jsonl"
    catalog, ns = load_catalog(settings), settings.catalog.namespace
    stats = ingest(spark, FileSource(path), IngestJob(catalog, ns, Decoder(), 4))
    assert stats.accepted["things"] == 9 and stats.dead_letters["part_1"] == 1
    log = catalog.load_table((ns, "things__log")).scan().to_arrow()
    assert sorted(log["sequence_number"].to_pylist()) == list(range(9))
    (dead,) = catalog.load_table((ns, "part_1__dead_letters")).scan().to_arrow().to_pylist()
    assert (dead["topic"], dead["offset"]) == ("cdclake.file.part-1", "4")  # its own file's line number


def test_the_configuration_reference_is_current_and_describes_every_key():
    """docs/configuration.md is what `python -m connector.config_reference` prints, and every
    key in it says what it does."""
    from connector.config_reference import keys, reference, sections

    docs = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
    assert docs.read_text() == reference(), "run: python -m connector.config_reference > docs/configuration.md"
    bare = [f"{h} {n}" for h, model, _ in sections() for n, f in keys(model) if not f.description]
    assert bare == [], "describe these keys (Field(description=...))"
