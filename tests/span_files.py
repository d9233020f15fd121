"""Reading span Parquet back in tests, whatever else the directory holds."""

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge.otel.span_columns import spans_to_tables
from agl_bridge.parquet_io import iter_parquet_files
from agl_bridge.schema import SPAN_SCHEMA


def all_rows(directory):
    """Every row of the span files (files that are not span Parquet left out)."""
    tables = []
    for path in iter_parquet_files(directory):
        try:
            t = pq.read_table(path)
        except pa.ArrowInvalid:
            continue
        if "trace_id" in t.column_names:
            tables.append(t)
    return pa.concat_tables(tables, promote_options="default").to_pylist()


def spans_to_table(spans):
    """SDK spans as one table of span rows (all partitions); raises on a span no row can hold."""
    made = spans_to_tables(spans)
    if made.bad:
        raise ValueError(f"span {made.bad[0][0].name!r}: {made.bad[0][1]}")
    if not made.tables:
        return SPAN_SCHEMA.empty_table()
    return pa.concat_tables(made.tables.values())
