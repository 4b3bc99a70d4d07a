"""The source section of the configuration: one model per source type, chosen by `type`.

A key that does not apply to the chosen source is an error naming it.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Discriminator, Field, SecretStr, Tag, field_validator, model_validator


class Section(BaseModel):
    """A configuration section: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


EVENTHUBS_KAFKA_PORT = 9093
_TYPE = "the source: file, kafka, eventhubs-kafka or eventhubs; the other keys of this section depend on it"


def starting_text(start: str | int | datetime) -> str:
    """A starting position as text (for Spark data source options): name, number or ISO time."""
    return start.isoformat() if isinstance(start, datetime) else str(start)


class _SourceBase(Section):
    batch_size: int = Field(
        1_000_000,
        gt=0,
        description="at most this many records per ingest batch (a Spark job, a commit per table)",
    )
    key_format: Literal["json", "text"] | None = Field(
        None,
        description="record keys: json (Debezium: a JSON object; anything else is a dead letter) or text "
        "(used as sent); default json, text for eventhubs (AMQP's partition key is text)",
    )

    @property
    def keys(self) -> Literal["json", "text"]:
        """The key format in force (`key_format`, or the source type's default)."""
        return self.key_format or ("text" if self.type == "eventhubs" else "json")  # type: ignore[attr-defined]


class FileSourceConfig(_SourceBase):
    """A kcat -J dump (JSON lines), replayed."""

    type: Literal["file"] = Field("file", description=_TYPE)
    path: str | None = Field(None, description="a kcat -J dump (JSON lines), a directory of them, or a glob")
    topic: str | None = Field(None, description="topic for file lines that carry none")

    def label(self) -> str:
        """What the source is, without a secret (names the ingest lease)."""
        return f"file {self.path}"


_STARTING: Any = Field(
    "earliest",
    description="where a partition with no committed position starts: earliest, latest, a "
    "sequence number / offset, or an enqueued time (ISO 8601)",
)


class KafkaCommonConfig(_SourceBase):
    topics: list[str] | None = Field(
        None, min_length=1, description="topics (event hubs) to read; each must exist (or give topics_pattern)"
    )
    topics_pattern: str | None = Field(
        None,
        description="instead of topics: a regular expression matched against whole topic names (internal __* "
        "topics never match); the topics are listed again every batch, so one created later is read from the "
        "next batch, and a pattern that matches nothing yet is no error",
    )
    group_id: str = Field("cdclake", description="consumer group whose offsets mirror the committed positions")
    security_protocol: str | None = Field(None, description="default PLAINTEXT (kafka), SASL_SSL (eventhubs-kafka)")
    starting_position: Literal["earliest", "latest"] | int | datetime = _STARTING
    fail_on_data_loss: bool = Field(
        True, description="stop when committed offsets no longer exist in the source (retention, compaction)"
    )
    unavailable_timeout_seconds: float = Field(60.0, gt=0, description="broker unreachable this long: fail")
    kafka: dict[str, str] = Field(
        default_factory=dict,
        description="more Kafka client settings by their librdkafka names (client.id, ssl.ca.location...); "
        "Spark's Kafka source gets them as kafka.<name>",
    )

    @field_validator("topics_pattern")
    @classmethod
    def _pattern(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as e:
                raise ValueError(
                    f"{pattern!r} is not a regular expression ({e}): give one such as 'db1\\.inventory\\..*'"
                ) from None
        return pattern

    @model_validator(mode="after")
    def _topics(self) -> KafkaCommonConfig:
        if self.topics is None and self.topics_pattern is None:
            raise ValueError("give source.topics (a list of topics) or source.topics_pattern (a regex)")
        if self.topics is not None and self.topics_pattern is not None:
            raise ValueError("source.topics and source.topics_pattern are both set: give one of them")
        return self

    def kafka_settings(self) -> dict[str, str]:
        """librdkafka settings (hold the secret)."""
        raise NotImplementedError

    def label(self) -> str:
        """What the source is, without a secret (names the ingest lease)."""
        where = f"{self.type} {self.kafka_settings()['bootstrap.servers']}"  # type: ignore[attr-defined]
        if self.topics_pattern is not None:
            return f"{where} topics_pattern {self.topics_pattern}"
        return f"{where} topics {','.join(self.topics or [])}"


class KafkaSourceConfig(KafkaCommonConfig):
    """A Kafka cluster."""

    type: Literal["kafka"] = Field(description=_TYPE)
    bootstrap_servers: str = Field(description="host:port list")
    sasl_mechanism: str | None = Field(None, description="PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")
    sasl_username: str | None = Field(None, description="SASL user")
    sasl_password: SecretStr | None = Field(None, description="SASL password (better CDCLAKE_SOURCE__SASL_PASSWORD)")

    def kafka_settings(self) -> dict[str, str]:
        conf = {"bootstrap.servers": self.bootstrap_servers, "security.protocol": self.security_protocol or "PLAINTEXT"}
        if self.sasl_mechanism:
            conf["sasl.mechanisms"] = self.sasl_mechanism
        if self.sasl_username:
            conf["sasl.username"] = self.sasl_username
        if self.sasl_password:
            conf["sasl.password"] = self.sasl_password.get_secret_value()
        return {**conf, **self.kafka}


def _event_hubs_connection_string(cs: SecretStr) -> SecretStr:
    text = cs.get_secret_value()
    if "Endpoint=sb://" not in text or "SharedAccessKey" not in text:
        raise ValueError(
            "not an Event Hubs connection string (expected Endpoint=sb://...;SharedAccessKeyName=...;"
            "SharedAccessKey=...)"
        )
    return cs


class EventHubsKafkaSourceConfig(KafkaCommonConfig):
    """Event Hubs through its Kafka endpoint."""

    type: Literal["eventhubs-kafka"] = Field(description=_TYPE)
    namespace: str | None = Field(None, description="Event Hubs namespace: <namespace>.servicebus.windows.net:9093")
    bootstrap_servers: str | None = Field(None, description="host:port, instead of the namespace's")
    connection_string: SecretStr = Field(description="Event Hubs connection string")

    @field_validator("connection_string")
    @classmethod
    def _cs(cls, cs: SecretStr) -> SecretStr:
        return _event_hubs_connection_string(cs)

    @model_validator(mode="after")
    def _where(self) -> EventHubsKafkaSourceConfig:
        if not (self.namespace or self.bootstrap_servers):
            raise ValueError("source.type = 'eventhubs-kafka' needs source.namespace (or source.bootstrap_servers)")
        return self

    def kafka_settings(self) -> dict[str, str]:
        conf = {
            "bootstrap.servers": self.bootstrap_servers
            or f"{self.namespace}.servicebus.windows.net:{EVENTHUBS_KAFKA_PORT}",
            "security.protocol": self.security_protocol or "SASL_SSL",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": "$ConnectionString",
            "sasl.password": self.connection_string.get_secret_value(),
        }
        return {**conf, **self.kafka}


class EventHubsSourceConfig(_SourceBase):
    """Event Hubs over AMQP (azure-eventhub)."""

    type: Literal["eventhubs"] = Field(description=_TYPE)
    connection_string: SecretStr = Field(description="Event Hubs connection string")
    event_hub: str | None = Field(None, description="event hub name; default the EntityPath")
    consumer_group: str = Field("$Default", description="consumer group to read as")
    starting_position: Literal["earliest", "latest"] | int | datetime = _STARTING
    reader: str = Field("connector.sources.eventhubs:sdk_reader", description="module:factory of the reader")
    reader_options: dict[str, str] = Field(default_factory=dict, description="more options for the reader")
    checkpoint_connection_string: SecretStr | None = Field(
        None, description="Azure Blob connection string: positions are mirrored to a BlobCheckpointStore"
    )
    checkpoint_container: str | None = Field(None, description="blob container of the checkpoint store")

    @model_validator(mode="after")
    def _check(self) -> EventHubsSourceConfig:
        if not (self.event_hub or "EntityPath=" in self.connection_string.get_secret_value()):
            raise ValueError(
                "source.type = 'eventhubs' needs source.event_hub (or an EntityPath in the connection string)"
            )
        if bool(self.checkpoint_connection_string) != bool(self.checkpoint_container):
            raise ValueError("source.checkpoint_connection_string and source.checkpoint_container go together")
        return self

    def label(self) -> str:
        """What the source is, without a secret (names the ingest lease)."""
        cs = self.connection_string.get_secret_value()
        host = re.search(r"Endpoint=sb://([^/;]+)", cs)
        hub = self.event_hub or re.search(r"EntityPath=([^;]+)", cs)[1]  # type: ignore[index]
        return f"eventhubs {host[1] if host else '?'}/{hub}"

    def eventhubs_options(self) -> dict[str, str]:
        """Options of the Event Hubs reader (hold the secret)."""
        cs = self.connection_string.get_secret_value()
        hub = self.event_hub or cs.split("EntityPath=", 1)[-1].split(";", 1)[0]
        return {
            "event_hub": hub,
            "connection_string": cs,
            "consumer_group": self.consumer_group,
            "reader": self.reader,
            "starting_position": starting_text(self.starting_position),
            **self.reader_options,
        }


def _source_type(value: Any) -> str:
    """The source's `type`; `file` when not given (`CDCLAKE_SOURCE__PATH=dump.jsonl` alone)."""
    return cast(str, value.get("type", "file") if isinstance(value, dict) else getattr(value, "type", "file"))


# One of the four, by `type`: a key that does not apply to the chosen source is an error naming it.
SourceConfig = Annotated[
    Annotated[FileSourceConfig, Tag("file")]
    | Annotated[KafkaSourceConfig, Tag("kafka")]
    | Annotated[EventHubsKafkaSourceConfig, Tag("eventhubs-kafka")]
    | Annotated[EventHubsSourceConfig, Tag("eventhubs")],
    Discriminator(_source_type),
]
