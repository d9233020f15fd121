"""Reading span Parquet back in tests, whatever else the directory holds."""

import pyarrow as pa
import pyarrow.parquet as pq

from agl_bridge.parquet_io import iter_parquet_files


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
