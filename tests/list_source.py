"""Records held in memory as a Source, for tests whose records no real source can carry
(arbitrary bytes in keys, values and headers): the same seek / bounded-batch contract as the
real sources, the batch handed to Spark as an Arrow table."""

from __future__ import annotations

from connector.batch import RecordBatch
from connector.core.records import SourceRecord
from connector.sources import RAW_COLUMNS, Source


class ListSource(Source):
    def __init__(self, records: list[SourceRecord]):
        self.records, self.next, self.floors = records, 0, {}
        self.committed: list[dict] = []

    def seek(self, positions):
        self.floors, self.next = dict(positions), 0

    def next_frame(self, spark, max_events):
        out = []
        while self.next < len(self.records) and len(out) < max_events:
            r = self.records[self.next]
            self.next += 1
            if r.sequence_number >= self.floors.get(r.stream, 0):
                out.append(r)
        return spark.createDataFrame(RecordBatch.of(out).table, RAW_COLUMNS) if out else None

    def commit(self, last):
        self.committed.append(dict(last))
