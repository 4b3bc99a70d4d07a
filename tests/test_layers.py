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


LIBRARIES = ("pyiceberg", "pyspark", "py4j", "confluent_kafka")
COMPAT = ("iceberg/compat.py", "iceberg/compat_spark.py")  # the modules that may use the libraries' internals
# The libraries' internals the project uses or used, by name (private, or left out of their
# documentation): the compat module's only.
INTERNALS = {
    "_jsc",
    "_jvm",
    "_gateway",
    "_convert_schema_if_needed",
    "_resolve_table_location",
    "_ensure_initialized",
    "getPersistentRDDs",
    "launch_gateway",
    "from_arrow_schema",
    "ArrowScan",
    "FileFormatFactory",
    "create_writer",
    "to_serialized_dict",
    "from_args",
    "fast_append",
    "append_data_file",
    "load_location_provider",
}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_only_the_compat_modules_use_the_libraries_internals():
    """No import of a private name (or module) of pyiceberg, PySpark, py4j or confluent-kafka,
    no pickle, and no private attribute the project does not define itself (a library
    object's), outside `COMPAT`."""
    trees = {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text())
        for package in ("connector", "iceberg", "quotas")
        for path in sorted((ROOT / package).rglob("*.py"))
    }
    own = set()  # names the project defines: its own private helpers are its business
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                own.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.arg):
                own.add(node.arg)
    wrong = []
    for path, tree in trees.items():
        if path in COMPAT:
            continue
        for node in ast.walk(tree):
            where = f"{path}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                modules, names = [node.module], [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                modules, names = [a.name for a in node.names], []
            else:
                modules, names = [], []
            for module in modules:
                parts = module.split(".")
                if parts[0] in ("pickle", "cloudpickle", "dill"):
                    wrong.append(f"{where} imports {module}")
                elif parts[0] in LIBRARIES and (any(map(_private, parts)) or any(map(_private, names))):
                    wrong.append(f"{where} imports a private name from {module}: {names}")
                elif parts[0] in LIBRARIES and INTERNALS.intersection(names):
                    wrong.append(f"{where} imports {sorted(INTERNALS.intersection(names))} from {module}")
            if isinstance(node, ast.Attribute):
                # confluent-kafka documents its local error codes with a leading underscore
                documented = isinstance(node.value, ast.Name) and node.value.id == "KafkaError"
                if node.attr in INTERNALS or (_private(node.attr) and node.attr not in own and not documented):
                    wrong.append(f"{where} uses {ast.unparse(node)}")
            elif isinstance(node, ast.Name) and node.id in INTERNALS:
                wrong.append(f"{where} uses {node.id}")
    where = " or ".join(COMPAT)
    assert not wrong, f"library internals belong in {where} (with a contract test): " + "; ".join(wrong)
