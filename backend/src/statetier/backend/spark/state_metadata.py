"""The ``statetier-metadata`` Spark data source: what an epoch of a checkpoint holds.

``spark.read.format("statetier-metadata").option("path", URI).load()`` lists, for one epoch
(option ``epoch``, default the latest), every keyed state with its kind, serializers, TTL, the
job's max parallelism and parallelism, the files and bytes it takes and, for a typed state, its
values' schema as the Spark type ``statetier`` reads them as; operator states with
their redistribution and element count; timers as internal states. The manifest says all of it
but the operator states, which cost a read of the (small) operator files. One task, on the
driver's plan: a listing, not a scan.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from statetier.backend.snapshot.manifest import Manifest
from statetier.backend.snapshot.reading import (
    open_epoch,
    operator_state_summaries,
    state_summaries,
)
from statetier.backend.spark.state_options import ReadOptions, open_store
from statetier.backend.spark.typed_columns import spark_ddl
from statetier.backend.typed.schema import stored_value_schema

__all__ = ["StateMetadataDataSource"]

COLUMNS = [
    ("epoch", "bigint"),
    ("state", "string"),
    ("kind", "string"),
    ("internal", "boolean"),
    ("value_serializer", "string"),
    ("value_schema", "string"),
    ("user_key_serializer", "string"),
    ("key_serializer", "string"),
    ("ttl_ms", "bigint"),
    ("ttl_update_type", "string"),
    ("max_parallelism", "int"),
    ("parallelism", "int"),
    ("files", "int"),
    ("bytes", "bigint"),
    ("redistribution", "string"),
    ("elements", "bigint"),
]


class StateMetadataDataSource(DataSource):
    """``format("statetier-metadata")``: one row per state of an epoch."""

    rows: list[tuple[Any, ...]]

    @classmethod
    def name(cls) -> str:
        return "statetier-metadata"

    def schema(self) -> str:
        options = ReadOptions.parse(self.options, needs_state=False)
        store = open_store(options)
        manifest = open_epoch(store, options.epoch)
        summaries = [*state_summaries(manifest), *operator_state_summaries(store, manifest)]
        for summary in summaries:
            summary["value_schema"] = _value_schema(manifest, summary)
        self.rows = [tuple(s[name] for name, _ in COLUMNS) for s in summaries]
        return ", ".join(f"`{name}` {ddl}" for name, ddl in COLUMNS)

    def reader(self, schema: Any) -> DataSourceReader:
        return _ListingReader(self.rows)


def _value_schema(manifest: Manifest, summary: dict[str, Any]) -> str | None:
    """The Spark type of a typed keyed state's values; None for schemaless or operator state."""
    keyed = summary["kind"] != "operator"
    schema = stored_value_schema(manifest.states[summary["state"]]) if keyed else None
    return None if schema is None else spark_ddl(schema)


class _ListingReader(DataSourceReader):
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def partitions(self) -> Sequence[InputPartition]:
        return [InputPartition(None)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        yield from self.rows
