"""The configuration reference, made from the settings' own field descriptions, so it cannot
drift from what the loader accepts:

    python -m connector.config_reference > docs/configuration.md

A test checks that docs/configuration.md is what this prints."""

from __future__ import annotations

import json
import re
import types
import typing
from pathlib import Path

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from connector.core.config import Settings
from connector.core.source_config import (
    EventHubsKafkaSourceConfig,
    EventHubsSourceConfig,
    FileSourceConfig,
    KafkaSourceConfig,
)

SOURCES: list[type[BaseModel]] = [
    FileSourceConfig,
    KafkaSourceConfig,
    EventHubsKafkaSourceConfig,
    EventHubsSourceConfig,
]
# what a section name stands for, where it is a map of sections
MAPS = {"tables": "tables.<table>", "custom": "quotas.custom.<tier>"}

HEAD = """# Configuration reference

One TOML file (`cdclake -c cdclake.toml ...`) plus `CDCLAKE_*` environment variables, which
win: `CDCLAKE_<SECTION>__<KEY>`, e.g. `CDCLAKE_COMPACTION__TOMBSTONE_RETENTION_HOURS=48`;
a section or a list is JSON (`CDCLAKE_SOURCE__TOPICS='["a", "b"]'`). Everything is checked at
start: an unknown key, a key of another source type or a bad value is one line naming it,
with exit code 2. Secrets (`SecretStr`) are never logged or printed.

This page is generated from the settings' field descriptions
(`python -m connector.config_reference > docs/configuration.md`).
"""


def type_text(annotation: object) -> str:
    """A field's type as a reader says it: `float | None`, `"source" | "log"`, `map of str`."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is dict:
        return f"map of {type_text(args[1])}"
    if origin is list:
        return f"list of {type_text(args[0])}"
    if annotation is type(None):
        return "unset"
    name = getattr(annotation, "__name__", str(annotation))
    return {"SecretStr": "secret", "Path": "path"}.get(name, name)


def default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "required"
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    return f"`{json.dumps(str(value) if isinstance(value, Path) else value)}`"


def keys(model: type[BaseModel]) -> list[tuple[str, FieldInfo]]:
    """The section's own keys (not its subsections), a source's `type` first."""
    fields = sorted(model.model_fields.items(), key=lambda f: f[0] != "type")
    return [
        (name, field)
        for name, field in fields
        if name not in MAPS and not isinstance(field.get_default(call_default_factory=True), BaseModel)
    ]


def rows(model: type[BaseModel]) -> list[str]:
    out = ["| key | type | default | what it does |", "|---|---|---|---|"]
    for name, field in keys(model):
        what = re.sub(r"\s+", " ", field.description or "").replace("|", "\\|")
        out.append(f"| `{name}` | {type_text(field.annotation).replace('|', 'or')} | {default_text(field)} | {what} |")
    return out


def sections() -> list[tuple[str, type[BaseModel], str]]:
    """(heading, model, its docstring) per section, in the order of the settings."""
    out: list[tuple[str, type[BaseModel], str]] = [("Top level", Settings, "")]
    for name, field in Settings.model_fields.items():
        annotation = field.annotation
        if name == "source":
            for model in SOURCES:
                kind = typing.get_args(model.model_fields["type"].annotation)[0]
                out.append((f'[source] with type = "{kind}"', model, model.__doc__ or ""))
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out.append((f"[{name}]", annotation, annotation.__doc__ or ""))
            for sub, f in annotation.model_fields.items():
                if sub in MAPS:
                    model = typing.get_args(f.annotation)[1]
                    out.append((f"[{MAPS[sub]}]", model, model.__doc__ or ""))
        elif name in MAPS:
            model = typing.get_args(annotation)[1]
            out.append((f"[{MAPS[name]}]", model, model.__doc__ or ""))
    return out


def reference() -> str:
    parts = [HEAD]
    for name, model, doc in sections():
        parts.append(f"## {name}\n")
        if doc and not doc.startswith(("A configuration section", "Usage docs")):
            parts.append(re.sub(r"\s+", " ", doc.strip()) + "\n")
        parts.append("\n".join(rows(model)) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(reference(), end="")
