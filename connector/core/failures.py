"""Faults of the environment (a full disk, a data file gone, damaged metadata, an unreadable
catalog) said in one line: what happened, to which table and file, and what to do. Pure:
it reads an exception's type, errno and text (Spark's Java errors arrive as text)."""

from __future__ import annotations

import errno
import re

# <warehouse>/<namespace>[.db]/<table>/(data|metadata)/<file>, as Iceberg's catalogs lay tables out
_TABLE_FILE = re.compile(
    r"(?P<path>(?:[a-z0-9]+:)?/[^\s'\"`,;()]*?/(?P<ns>[^/\s]+?)(?:\.db)?/(?P<table>[^/\s]+)/(?P<kind>data|metadata)/[^\s'\"`,;()]+)"
)
_NO_SPACE = ("No space left on device", "ENOSPC", "Disk quota exceeded")
_GONE = ("FileNotFoundException", "No such file or directory", "does not exist", "NoSuchKey", "Not Found")
_DAMAGED = (
    "Invalid JSON",
    "JsonParseException",
    "JsonEOFException",
    "Unexpected end-of-input",
    "MismatchedInputException",
    "EOF while parsing",
    "is not a Parquet file",
    "Failed to read footer",
)
_CATALOG = (
    "unable to open database file",
    "no such table: iceberg_tables",
    "database disk image is malformed",
    "file is not a database",
)


def describe(e: BaseException) -> str | None:
    """One line for a known fault of the environment, else None."""
    text = f"{type(e).__name__}: {e}"
    cause = e.__cause__ or e.__context__
    if cause is not None:
        text += f"\n{type(cause).__name__}: {cause}"
    where = _TABLE_FILE.search(text)
    table = f"table {where['ns']}.{where['table']}" if where else "a table"
    file = f" ({where['path']})" if where else ""
    if (isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT)) or any(s in text for s in _NO_SPACE):
        return (
            f"no space left on the device writing {table}{file}: nothing partial is visible (a write commits "
            "whole or not at all); free space or move the warehouse, then rerun: it resumes where the tables are"
        )
    if any(s in text for s in _CATALOG):
        return (
            f"the catalog cannot be read ({_first_line(text, _CATALOG)}): restore the catalog database from a "
            "backup, or check catalog.uri"
        )
    for markers, what in ((_DAMAGED, "is damaged"), (_GONE, "is gone")):
        if where and any(m in text for m in markers):
            kind = "metadata file" if where["kind"] == "metadata" else "data file"
            why = f" ({_first_line(text, markers)})" if markers is _DAMAGED else ""
            return (
                f"{table}: its {kind} {where['path']} {what}{why}; restore the file from a backup, or roll the "
                "table back to a snapshot that does not use it (Iceberg's rollback_to_snapshot); other tables "
                "are not affected"
            )
    return None


def _first_line(text: str, markers: tuple[str, ...]) -> str:
    """The line of `text` with the first of `markers`, cut to a readable length."""
    for line in text.splitlines():
        if any(m in line for m in markers):
            return line.strip()[:200]
    return text.splitlines()[0][:200]
