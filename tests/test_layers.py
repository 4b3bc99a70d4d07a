"""The import graph flows one way: cli -> app -> pipeline / compaction -> decoding, quotas,
tables -> core. Checked on the source (every import, at module level or inside a function)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def imports(package: str) -> list[tuple[str, str]]:
    """(module, imported module) for every import in `package`."""
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                out.append((module, node.module))
            elif isinstance(node, ast.Import):
                out += [(module, a.name) for a in node.names]
    return out


def under(name: str, *packages: str) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(
    "package, forbidden, allowed",
    [
        # core: what every package uses (records, ordering, errors, faults, configuration)
        ("connector/core", ("connector", "iceberg", "quotas"), ("connector.core",)),
        # the tables and the quotas use the core only, never the connector's pipeline or CLI
        ("iceberg", ("connector",), ("connector.core",)),
        ("quotas", ("connector",), ("connector.core",)),
        # nothing below the CLI imports it
        ("connector", ("connector.cli",), ()),
        ("iceberg", ("connector.cli",), ()),
    ],
)
def test_imports_flow_one_way(package: str, forbidden: tuple[str, ...], allowed: tuple[str, ...]) -> None:
    wrong = [
        f"{m} imports {name}" for m, name in imports(package) if under(name, *forbidden) and not under(name, *allowed)
    ]
    assert not wrong, wrong
