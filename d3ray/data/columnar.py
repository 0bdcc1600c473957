"""Read columnar shards: parquet files and Arrow IPC files (a ``datasets`` ``save_to_disk`` folder).

A columnar shard is read with pyarrow inside the same per-shard read task as a JSONL shard
(:func:`d3ray.data.pipeline.read_shard_blocks`), so that every row is a record with a position, a
bad row is a counted bad record, a per-domain lane keeps its own rows and a stream resumes at any
row, exactly as for JSONL. Only the columns a reader asks for are read (parquet: column pruning).

    parquet   pyarrow.parquet.ParquetFile: row group by row group (the group is the unit a reader
              resumes at), each in batches of ``batch_rows`` rows
    arrow     pyarrow.ipc: the stream format ``datasets`` writes (``data-00000-of-00001.arrow``,
              ``cache-*.arrow``) or the file format (``ARROW1`` magic); a record batch is a group

A row's position (:class:`~d3ray.data.shards.ShardPosition`): ``line`` = 1-based row number,
``offset`` = 0-based row index, ``frame_offset`` = its group, ``frame_start`` = the group's first row.

A file pyarrow cannot read (a cut or corrupt footer, a corrupt row group or batch) yields a batch
with ``error`` set instead of rows: one bad record (``corrupt_columnar``) for what could not be read.
Parquet goes on with the next row group (groups are independent); an Arrow stream cannot.

Fields are found by name, dotted for nested ones (``meta.redpajama_set_name``: column ``meta``, a
struct, its field ``redpajama_set_name``); a column whose name itself holds the dots wins.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.compute as pc

from d3ray.data.shards import Shard, ShardPosition

_ARROW_FILE_MAGIC = b"ARROW1"
_READ_ERRORS = (pa.ArrowException, OSError)  # what pyarrow raises on bytes it cannot decode


@dataclass(frozen=True)
class ColumnBatch:
    """Consecutive rows of one group of a columnar shard, or (``error`` set) rows that could not be read.

    ``first_row`` is the 0-based index of the batch's first row in the shard; ``group`` / ``group_start``
    the group holding it and that group's first row. An error batch has ``table`` None and ``n_rows``
    the rows it stands for (parquet: the group's, from the footer; 0 when unknown).
    """

    group: int
    group_start: int
    first_row: int
    n_rows: int
    table: pa.RecordBatch | None
    columns: tuple[str, ...]
    """Top-level column names of the file (for messages naming a missing field)."""
    error: str = ""

    def position(self, i: int) -> ShardPosition:
        """The position of the batch's ``i``-th row."""
        row = self.first_row + i
        return ShardPosition(row + 1, row, self.group, self.group_start)


def find_field(schema: pa.Schema, key: str) -> tuple[str, tuple[str, ...]] | None:
    """``(top-level column, struct path below it)`` of a dotted field name in ``schema``, or None."""
    if key in schema.names:
        return key, ()
    top, *path = key.split(".")
    if top not in schema.names:
        return None
    kind = schema.field(top).type
    for part in path:
        if not pa.types.is_struct(kind) or kind.get_field_index(part) < 0:
            return None
        kind = kind.field(part).type
    return top, tuple(path)


def field_values(table: pa.RecordBatch, key: str) -> list[Any] | None:
    """The values of a dotted field, one per row (None where null), or None when the table lacks it."""
    found = find_field(table.schema, key)
    if found is None:
        return None
    top, path = found
    column: Any = table.column(top)
    for part in path:
        column = pc.struct_field(column, part)
    return column.to_pylist()


def read_schema(shard: Shard) -> pa.Schema:
    """The shard's schema (parquet: from the footer; arrow: the stream's header).

    Raises:
        pyarrow.ArrowException, OSError: the file is not readable parquet or Arrow IPC.
    """
    with fsspec.open(shard.uri, "rb") as f:
        if shard.uri.lower().endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.ParquetFile(f).schema_arrow
        return _open_arrow(f).schema


def iter_column_batches(shard: Shard, keys: Sequence[str] | None, start: ShardPosition | None = None,
                        batch_rows: int = 1024) -> Iterator[ColumnBatch]:
    """The shard's rows in file order, from its start or from ``start``, in batches within one group.

    Args:
        shard: a ``.parquet`` or ``.arrow`` shard.
        keys: the fields to read (dotted names; a missing one is simply absent from the tables); None
            reads every column.
        start: a row position from an earlier read (see the module docstring).
        batch_rows: rows per batch at most.
    """
    start = start or ShardPosition()
    skip = start.offset - start.frame_start
    with fsspec.open(shard.uri, "rb") as f:
        if shard.uri.lower().endswith(".parquet"):
            yield from _parquet_batches(f, keys, start.frame_offset, skip, batch_rows)
        else:
            yield from _arrow_batches(f, keys, start.frame_offset, skip, batch_rows)


def _columns(schema: pa.Schema, keys: Sequence[str] | None) -> list[str] | None:
    if keys is None:
        return None
    found = (find_field(schema, k) for k in keys)
    return list(dict.fromkeys(f[0] for f in found if f is not None))


def _parquet_batches(f: Any, keys: Sequence[str] | None, group0: int, skip: int,
                     batch_rows: int) -> Iterator[ColumnBatch]:
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except _READ_ERRORS as err:
        yield ColumnBatch(0, 0, 0, 0, None, (), f"not a readable parquet file: {err}")
        return
    schema = pf.schema_arrow
    names, columns = tuple(schema.names), _columns(schema, keys)
    starts = [0]
    for g in range(pf.num_row_groups):
        starts.append(starts[-1] + pf.metadata.row_group(g).num_rows)
    for group in range(group0, pf.num_row_groups):
        row = starts[group] + (skip if group == group0 else 0)
        try:
            for table in pf.iter_batches(batch_size=batch_rows, row_groups=[group], columns=columns):
                if skip and group == group0:  # resuming inside this group
                    cut = min(skip, table.num_rows)
                    table, skip = table.slice(cut), skip - cut
                    if not table.num_rows:
                        continue
                yield ColumnBatch(group, starts[group], row, table.num_rows, table, names)
                row += table.num_rows
        except _READ_ERRORS as err:
            yield ColumnBatch(group, starts[group], row, starts[group + 1] - row, None, names,
                              f"row group {group} unreadable: {err}")
            skip = 0


def _open_arrow(f: Any) -> Any:
    head = f.read(len(_ARROW_FILE_MAGIC))
    f.seek(0)
    return pa.ipc.open_file(f) if head == _ARROW_FILE_MAGIC else pa.ipc.open_stream(f)


def _arrow_batches(f: Any, keys: Sequence[str] | None, group0: int, skip: int,
                   batch_rows: int) -> Iterator[ColumnBatch]:
    try:
        reader = _open_arrow(f)
    except _READ_ERRORS as err:
        yield ColumnBatch(0, 0, 0, 0, None, (), f"not a readable Arrow IPC file: {err}")
        return
    names, columns = tuple(reader.schema.names), _columns(reader.schema, keys)
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        groups: Iterator[pa.RecordBatch] = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        groups = iter(reader)
    group = group_start = 0
    while True:
        try:
            batch = next(groups, None)
        except _READ_ERRORS as err:
            yield ColumnBatch(group, group_start, group_start, 0, None, names,
                              f"record batch {group} unreadable: {err}")
            return
        if batch is None:
            return
        if group >= group0:
            if columns is not None:
                batch = batch.select(columns)
            first = skip if group == group0 else 0
            for at in range(first, batch.num_rows, batch_rows):
                table = batch.slice(at, batch_rows)
                yield ColumnBatch(group, group_start, group_start + at, table.num_rows, table, names)
        group_start += batch.num_rows
        group += 1
