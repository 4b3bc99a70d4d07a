"""The state table's column plan, table-driven (no Spark): what a round adds and widens, and
which after-image signatures it refuses (those events become dead letters, the table goes on)."""

import json

import pytest

from iceberg.compaction.schema import plan_columns


def sig(**types) -> str:
    return json.dumps(types, sort_keys=True)


@pytest.mark.parametrize(
    "existing,signatures,max_new,columns,add,widen,refused",
    [
        # new columns, all of them in one change
        (
            {},
            [sig(id="bigint", v="string")],
            10,
            {"id": "bigint", "v": "string"},
            {"id": "bigint", "v": "string"},
            {},
            [],
        ),
        # widenings Iceberg can do: int -> bigint, float -> double
        ({"id": "int"}, [sig(id="bigint")], 10, {"id": "bigint"}, {}, {"id": "bigint"}, []),
        ({"v": "double"}, [sig(v="float")], 10, {"v": "double"}, {}, {}, []),
        ({"v": "decimal(10,2)"}, [sig(v="bigint")], 10, {"v": "decimal(10,2)"}, {}, {}, []),
        # a column that is an integer in one event and a string in another: the second is refused
        (
            {},
            [sig(id="bigint", v="bigint"), sig(id="bigint", v="string")],
            10,
            {"id": "bigint", "v": "bigint"},
            {"id": "bigint", "v": "bigint"},
            {},
            [sig(id="bigint", v="string")],
        ),
        # a column new in the round takes integers and floats together as double
        ({}, [sig(w="bigint"), sig(w="double")], 10, {"w": "double"}, {"w": "double"}, {}, []),
        # the table's type cannot be promoted
        ({"v": "bigint"}, [sig(v="double")], 10, {"v": "bigint"}, {}, {}, [sig(v="double")]),
        ({"v": "bigint"}, [sig(v="string")], 10, {"v": "bigint"}, {}, {}, [sig(v="string")]),
        # names: only case differs from the table's, or a metadata column's
        ({"name": "string"}, [sig(Name="string")], 10, {"name": "string"}, {}, {}, [sig(Name="string")]),
        ({}, [sig(_key="string")], 10, {}, {}, {}, [sig(_key="string")]),
        # too many new columns in one round: the event that brings them is refused, the others go on
        (
            {},
            [sig(a="int", b="int", c="int"), sig(z="int")],
            2,
            {"z": "int"},
            {"z": "int"},
            {},
            [sig(a="int", b="int", c="int")],
        ),
        # a refused signature changes nothing of the plan, even in the columns it shares
        (
            {},
            [sig(a="int", v="string"), sig(a="bigint", v="boolean")],
            10,
            {"a": "bigint", "v": "boolean"},
            {"a": "bigint", "v": "boolean"},
            {},
            [sig(a="int", v="string")],
        ),
    ],
)
def test_plan_columns(existing, signatures, max_new, columns, add, widen, refused):
    plan = plan_columns(existing, signatures, max_new)
    assert (plan.columns, plan.add, plan.widen, sorted(plan.refused)) == (columns, add, widen, sorted(refused))
    for s in refused:  # the reason names the column
        assert any(c in plan.refused[s] for c in json.loads(s)) or "more than" in plan.refused[s]
