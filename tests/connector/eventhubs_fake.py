"""Real azure-eventhub `EventData`, built from AMQP message bytes (`EventData.from_bytes`),
served by a PartitionReader. No Event Hubs emulator runs here: this is the SDK boundary."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from azure.eventhub import EventData
from azure.eventhub._pyamqp._encode import encode_payload
from azure.eventhub._pyamqp.message import Message
from azure.eventhub._pyamqp.types import TYPE, VALUE, AMQPTypes


def amqp_event(
    seq: int,
    offset: str,
    enqueued_ms: int,
    partition_key: str | None,
    body: bytes | None,
    properties: dict | None = None,
) -> EventData:
    """An event as the service delivers it: annotations carry AMQP types; no body = tombstone."""
    ann = {
        b"x-opt-sequence-number": {TYPE: AMQPTypes.long, VALUE: seq},
        b"x-opt-offset": {TYPE: AMQPTypes.string, VALUE: offset},
        b"x-opt-enqueued-time": {TYPE: AMQPTypes.timestamp, VALUE: enqueued_ms},
    }
    if partition_key is not None:
        ann[b"x-opt-partition-key"] = {TYPE: AMQPTypes.string, VALUE: partition_key}
    kwargs = {"message_annotations": ann}
    if body is not None:
        kwargs["data"] = [body]
    if properties:
        kwargs["application_properties"] = properties
    return EventData.from_bytes(bytes(encode_payload(bytearray(), Message(**kwargs))))


class FakeHub:
    """Partitions of events from a JSON file: {partition_id: [[seq, offset, ms, key, body|null], ...]}."""

    def __init__(self, options: Mapping[str, str]):
        self.data = json.loads(Path(options["fake_events"]).read_text())
        self.missing = int(options.get("fake_missing", 0))  # events the hub counts but cannot return

    def partition_ids(self) -> list[str]:
        return sorted(self.data, key=int)

    def end_sequence_number(self, pid: str) -> int:
        events = self.data[pid]
        return events[-1][0] + 1 + self.missing if events else 0

    def read(self, pid: str, from_seq: int, max_events: int) -> list[EventData]:
        rows = [e for e in self.data[pid] if e[0] >= from_seq][:max_events]
        return [amqp_event(s, o, ms, k, None if b is None else b.encode()) for s, o, ms, k, b in rows]

    def sequence_number_at(self, pid: str, when) -> int:
        ms = when.timestamp() * 1000
        return next((e[0] for e in self.data[pid] if e[2] >= ms), self.end_sequence_number(pid))


def reader(options: Mapping[str, str]) -> FakeHub:
    return FakeHub(options)
