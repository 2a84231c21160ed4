"""CSV files read by pyarrow, every cell as the text the file holds except in the number fields.

CSV has no types, and a reader that guesses them changes what the file says: an id `001` became the
integer 1 (and then collided with an id `1`), `1e3` the float 1000.0, a prompt `NA` or `null` a
missing value. Here every column is read as its exact text (pyarrow's `ConvertOptions.column_types`,
with no null markers for text), and each cell of a number field's column (`NUMBER_FIELDS`, by the
column each is mapped from) is read as an integer, else a float, where pyarrow's usual null markers
(`NA`, `nan`, ...) are missing values; a cell that is neither stays text, for validation to drop its
record alone (a column typed by pyarrow from the file's first block refused the whole file at a later
`5.5` among whole numbers, or an `abc`). An empty cell is a missing value in every column: the only
way a CSV row can leave a field out.

A quoted cell may span lines (a prompt of several paragraphs): read without pyarrow's
`newlines_in_values`, a 2 MB file of such prompts stopped at its first block boundary ("parser got out
of sync with chunker"). A row with more or fewer cells than the header is that row's problem, not the
file's: it comes out as a `CsvRow` with its `problem` at its position among the data rows, and the rows
after it keep theirs (pyarrow numbers the rows it hands its `invalid_row_handler`, header first, when it
reads on one thread). But a misfit row that spans lines refuses the file: a quote left open takes every
record after it into one cell, and dropping that as one row would lose them all without a word.
"""

from __future__ import annotations

from collections.abc import Collection, Generator, Iterator
from pathlib import Path
from typing import Any, NamedTuple

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


class CsvRow(NamedTuple):
    position: int  # among the data rows of every file read, 0-based
    values: dict[str, Any] | None  # None for a row of the wrong width
    problem: str | None = None


def csv_column_names(path: Path) -> list[str]:
    """The header's names (the first block is parsed for them: its misfit rows are `_file_rows`' to tell)."""
    parse = pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=lambda row: "skip")
    with pacsv.open_csv(path, parse_options=parse) as reader:
        return list(reader.schema.names)


def csv_rows(paths: list[Path], numbers: frozenset[str]) -> Iterator[CsvRow]:
    """Each file's data rows in order, numbered on from one file to the next; `numbers`: the columns
    whose type is inferred."""
    position = 0
    for path in paths:
        position = yield from _file_rows(path, numbers, position)


def _file_rows(path: Path, numbers: frozenset[str], first: int) -> Generator[CsvRow, None, int]:
    """One file's rows from position `first`; returns the position after its last."""
    text = {name: pa.string() for name in csv_column_names(path)}
    misfits: dict[int, str] = {}  # data row index -> why it was skipped

    def skip(row: pacsv.InvalidRow) -> str:
        if row.number is None or "\n" in row.text or "\r" in row.text:
            # unnumbered, it could not be placed; across lines, it may be a quote left open that took
            # every record after it into one cell: the file is refused, as it was before, losing nothing
            return "error"
        misfits[row.number - 2] = (f"row {row.number} of {path} has {row.actual_columns} cells where its header "
                                   f"has {row.expected_columns}: {row.text[:200]}")
        return "skip"

    read = pacsv.ReadOptions(use_threads=False)  # rows numbered for `skip`
    parse = pacsv.ParseOptions(newlines_in_values=True, invalid_row_handler=skip)
    convert = pacsv.ConvertOptions(column_types=text, strings_can_be_null=False)
    index = 0
    with pacsv.open_csv(path, read_options=read, parse_options=parse, convert_options=convert) as reader:
        for batch in reader:
            for values in _empty_text_as_null(batch).to_pylist():
                while index in misfits:
                    yield CsvRow(first + index, None, misfits.pop(index))
                    index += 1
                yield CsvRow(first + index, {name: _number(value) if name in numbers else value
                                             for name, value in values.items()})
                index += 1
    for trailing in sorted(misfits):  # the rows after the last good one: index, index + 1, ...
        yield CsvRow(first + trailing, None, misfits[trailing])
    return first + index + len(misfits)


def _empty_text_as_null(batch: pa.RecordBatch) -> pa.RecordBatch:
    missing = pa.scalar(None, pa.string())
    arrays = [pc.if_else(pc.equal(column, ""), missing, column) for column in batch.columns]
    return pa.RecordBatch.from_arrays(arrays, schema=batch.schema)


def _number(cell: str | None) -> int | float | str | None:
    """A number field's cell: an integer, else a float, None for a null marker, else its text."""
    if cell is None or cell in _NULL_MARKERS:
        return None
    for parse in (int, float):
        try:
            return parse(cell)
        except ValueError:
            pass
    return cell


_NULL_MARKERS = frozenset(pacsv.ConvertOptions().null_values)  # pyarrow's own: NA, nan, null, #N/A, ...
