"""CSV files read by pyarrow, every cell as the text the file holds except in the number fields.

CSV has no types, and a reader that guesses them changes what the file says: an id `001` became the
integer 1 (and then collided with an id `1`), `1e3` the float 1000.0, a prompt `NA` or `null` a
missing value. Here every column is read as its exact text (pyarrow's `ConvertOptions.column_types`,
with no null markers for text), except the columns of the number fields (`NUMBER_FIELDS`, by the
column each is mapped from), whose type pyarrow infers and where its usual null markers (`NA`, `nan`,
...) are missing values. An empty cell is a missing value in every column: the only way a CSV row can
leave a field out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

# sampling parameters read as numbers (`validate` checks their types); every other field is text
NUMBER_FIELDS = ("max_new_tokens", "temperature", "top_p", "seed")


def number_columns(column_map: dict[str, str], text_fields: Collection[str]) -> frozenset[str]:
    """The source columns of the number fields; a column also mapped to a text field stays text."""
    numbers = {column_map.get(name, name) for name in NUMBER_FIELDS}
    texts = {column_map.get(name, name) for name in text_fields if name not in NUMBER_FIELDS}
    return frozenset(numbers - texts)


def csv_column_names(path: Path) -> list[str]:
    with pacsv.open_csv(path) as reader:
        return list(reader.schema.names)


def csv_batches(paths: list[Path], numbers: frozenset[str]) -> Iterator[pa.RecordBatch]:
    """Each file's rows in order, in record batches; `numbers`: the columns whose type is inferred."""
    for path in paths:
        text = {name: pa.string() for name in csv_column_names(path) if name not in numbers}
        options = pacsv.ConvertOptions(column_types=text, strings_can_be_null=False)
        with pacsv.open_csv(path, convert_options=options) as reader:
            for batch in reader:
                yield _empty_text_as_null(batch, text.keys())


def _empty_text_as_null(batch: pa.RecordBatch, text: Collection[str]) -> pa.RecordBatch:
    missing = pa.scalar(None, pa.string())
    arrays = [pc.if_else(pc.equal(column, ""), missing, column) if name in text else column
              for name, column in zip(batch.schema.names, batch.columns, strict=True)]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)
