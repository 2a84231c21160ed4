"""`specbatch report`: the sql/ queries over one or more job directories, as tables and plots.

All figures come from `sql/*.sql` run by DuckDB over the views in `sql/views.sql`; this module only
connects, renders (Rich, Markdown, HTML) and draws (matplotlib's Agg canvas via `Figure`, no pyplot
state). Outputs go into the first job directory: report.md, report.html (PNGs embedded) and PNGs;
for a job on an object store (`s3://...`, read through its fsspec file system registered with
DuckDB), into `reports/JOB_ID/` here.
"""

from __future__ import annotations

import base64
import html
import logging
import os
from dataclasses import dataclass
from decimal import Decimal
from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
from rich.console import Console
from rich.table import Table

from specbatch import ledger
from specbatch.quarantine import damaged_parts
from specbatch.report.plots import PLOTS
from specbatch.storage import ObjectStorage, is_url, join, location_name, open_storage

log = logging.getLogger(__name__)

SQL_DIR_ENV = "SPECBATCH_SQL_DIR"
QUERIES: dict[str, str] = {  # file stem -> title, in report order
    "throughput_vs_cost": "Throughput versus cost",
    "latency": "Latency (completed requests)",
    "drops": "Dropped and cancelled requests",
    "acceptance_by_domain": "Acceptance by domain",
    "acceptance_by_position": "Acceptance by draft position",
    "acceptance_by_k": "Acceptance by lookahead k",
    "acceptance_over_time": "Acceptance over time",
    "worker_balance": "Worker balance",
    "scheduler_overhead": "Scheduler overhead",
    "prefix_cache": "Shared prefixes",
    "kv_blocks": "KV blocks: held, shared, cached",
    "speculation_limit": "Speculation against its limit",
    "speculation_by_drafter": "Speculation per drafter",
    "structured_output": "Structured output: grammar masks and forced drafts",
}
DATA_QUERIES = ("round_timeline", "latency_samples")  # plot inputs, not printed
_GLOB_CHARS = frozenset("*?[]{},\\")  # sql/views.sql splits job_dir at ',' and globs each path
_MAX_COLUMNS = 10  # wider results with few rows are shown transposed (one column per row)
_HTML_HEAD = (
    "<!doctype html><html><head><meta charset='utf-8'><title>specbatch report</title><style>"
    "body{font-family:sans-serif;margin:2em} table{border-collapse:collapse;margin-bottom:1em}"
    " td,th{border:1px solid #ccc;padding:2px 6px;text-align:right} img{max-width:100%}"
    "</style></head>"
)


class ReportError(ValueError):
    """Job directories the report cannot read; the CLI prints it and exits with code 2."""


@dataclass
class QueryResult:
    name: str
    title: str
    description: str
    columns: list[str]
    rows: list[tuple[Any, ...]]

    def records(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def column(self, name: str) -> list[Any]:
        index = self.columns.index(name)
        return [row[index] for row in self.rows]


def sql_dir() -> Path:
    """The queries: $SPECBATCH_SQL_DIR when set, else `specbatch/sql/` as a wheel installs it (setup.py
    copies the repository's `sql/` in), else the source checkout's top-level `sql/`."""
    if os.environ.get(SQL_DIR_ENV):
        return Path(os.environ[SQL_DIR_ENV])
    installed = Path(str(resources.files("specbatch") / "sql"))
    return installed if installed.is_dir() else Path(__file__).resolve().parents[2] / "sql"


def connect(
    job_dirs: list[str] | list[Path], baseline: str | None = None, con: duckdb.DuckDBPyConnection | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection with the views of sql/views.sql over these job directories (paths or URLs)."""
    if not job_dirs:
        raise ReportError("no job directory given")
    names = [location_name(d) for d in job_dirs]
    parts: list[str] = []  # every counted part's files, `{table}` for the table (sql/views.sql: ledger_parts)
    if len(set(names)) != len(names):
        raise ReportError(f"job directories must have distinct names (the job_id): {names}")
    for job_dir in job_dirs:
        special = sorted({c for c in str(job_dir) if c in _GLOB_CHARS or not c.isprintable()})
        if special:
            raise ReportError(f"job directory {str(job_dir)!r} has characters DuckDB would read as a glob "
                              f"or a list ({''.join(special)!r}); rename or move it")
        try:
            committed = ledger.committed_parts(job_dir)
            damaged = damaged_parts(job_dir, committed, deep=True)  # results read whole: DuckDB reads them anyway
            missing = _missing_files(job_dir, committed)
        except Exception as error:  # an object store that cannot be reached or read
            raise ReportError(f"cannot read {job_dir}: {error}") from error
        for name, key in damaged.items():
            log.warning("%s: leaving out part %s (%s is damaged; the job's next run re-runs it)", job_dir, name, key)
        for name, key in missing.items():
            log.warning("%s: leaving out part %s (%s is missing)", job_dir, name, key)
        committed = [name for name in committed if name not in damaged and name not in missing]
        if not committed:
            raise ReportError(f"{job_dir}: no committed parts (results/*.parquet); nothing to report")
        parts += [join(job_dir, "{table}", name + ledger.PART_SUFFIX) for name in committed]
    if baseline is not None and location_name(baseline) not in names:
        raise ReportError(f"baseline {baseline!r} is not one of the jobs {names}")
    con = con or duckdb.connect()
    registered = set(con.list_filesystems())
    for storage in map(open_storage, job_dirs):
        if isinstance(storage, ObjectStorage) and storage.fs.protocol[0] not in registered:  # one per protocol
            registered.add(storage.fs.protocol[0])
            con.register_filesystem(storage.fs)  # DuckDB reads s3://... through the same fsspec file system
    con.execute("SET VARIABLE job_dir = ?", [",".join(str(d) for d in job_dirs)])
    con.execute("SET VARIABLE ledger_parts = ?", [parts])
    if baseline is not None:
        con.execute("SET VARIABLE baseline_job = ?", [location_name(baseline)])
    con.execute((sql_dir() / "views.sql").read_text())
    return con


def _missing_files(job_dir: str | Path, committed: list[str]) -> dict[str, str]:
    """Committed parts one of whose table files is gone (deleted by hand after the commit: a part's
    other files are written before its results file): part name -> the first missing file's key.
    The views read every table's file of every part they are given, and one absent file failed the
    whole report."""
    storage = open_storage(job_dir)
    present = {table: storage.sizes(table, ledger.PART_SUFFIX) for table in ledger.TABLES}
    missing: dict[str, str] = {}
    for name in committed:
        absent = [table for table in ledger.TABLES if name + ledger.PART_SUFFIX not in present[table]]
        if absent:
            missing[name] = ledger.part_key(absent[0], name)
    return missing


def _description(sql: str) -> str:
    lines = []
    for line in sql.splitlines():
        if not line.startswith("--"):
            break
        lines.append(line[3:].rstrip() if line.startswith("-- ") else line[2:].rstrip())
    return "\n".join(lines).strip()


def run_query(con: duckdb.DuckDBPyConnection, name: str) -> QueryResult:
    sql = (sql_dir() / f"{name}.sql").read_text()
    cursor = con.execute(sql)
    columns = [column[0] for column in cursor.description]
    return QueryResult(name, QUERIES.get(name, name), _description(sql), columns, cursor.fetchall())


def run_queries(con: duckdb.DuckDBPyConnection) -> dict[str, QueryResult]:
    return {name: run_query(con, name) for name in (*QUERIES, *DATA_QUERIES)}


def fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float | Decimal):
        return f"{float(value):.4g}"
    return str(value)


def _grid(result: QueryResult) -> tuple[list[str], list[list[str]]]:
    """Header and cells; a wide result with few rows is transposed so it stays readable.

    Transposed, each row of the result becomes a column named by its leading key (job_id, or
    job_id and the next column when job_id repeats).
    """
    cells = [[fmt(v) for v in row] for row in result.rows]
    if len(result.columns) <= _MAX_COLUMNS or not 0 < len(cells) <= _MAX_COLUMNS:
        return result.columns, cells
    num_keys = 1 if len({row[0] for row in cells}) == len(cells) else 2
    header = [" / ".join(result.columns[:num_keys]), *(" / ".join(row[:num_keys]) for row in cells)]
    names = result.columns[num_keys:]
    return header, [[name, *(row[num_keys + i] for row in cells)] for i, name in enumerate(names)]


def rich_table(result: QueryResult, max_rows: int = 24) -> Table:
    header, cells = _grid(result)
    caption = f"{len(cells) - max_rows} more rows in report.md" if len(cells) > max_rows else None
    table = Table(title=result.title, title_justify="left", caption=caption)
    for name in header:
        table.add_column(name, overflow="fold")
    for row in cells[:max_rows]:
        table.add_row(*row)
    if not cells:
        table.caption = "no rows"
    return table


def markdown_table(result: QueryResult) -> str:
    if not result.rows:
        return "_No rows (nothing of this kind was recorded, e.g. no rounds or no speculation)._\n"
    header, cells = _grid(result)
    escape = [[_cell(c) for c in row] for row in [header, *cells]]
    lines = ["| " + " | ".join(row) + " |" for row in escape]
    lines.insert(1, "|" + "---|" * len(header))
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    """A Markdown table cell: `|` escaped, a line break written as `\\n` (it would end the row)."""
    return text.replace("|", "\\|").replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\r")


def _html_table(result: QueryResult) -> str:
    if not result.rows:
        return "<p><em>No rows.</em></p>"
    header, cells = _grid(result)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in cells)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_markdown(job_dirs: list[str], results: list[QueryResult], plots: list[Path]) -> str:
    parts = ["# specbatch report", "", "Jobs: " + ", ".join(f"`{d}`" for d in job_dirs), ""]
    parts += [f"![{p.stem}]({p.name})" for p in plots]
    for result in results:
        parts += ["", f"## {result.title}", "", "```text", result.description, "```", ""]
        parts.append(markdown_table(result))
    return "\n".join(parts)


def render_html(job_dirs: list[str], results: list[QueryResult], plots: list[Path]) -> str:
    body = [f"<h1>specbatch report</h1><p>Jobs: {html.escape(', '.join(map(str, job_dirs)))}</p>"]
    for plot in plots:
        data = base64.b64encode(plot.read_bytes()).decode()
        body.append(f'<h2>{plot.stem}</h2><img alt="{plot.stem}" src="data:image/png;base64,{data}">')
    for result in results:
        body.append(f"<h2>{html.escape(result.title)}</h2><pre>{html.escape(result.description)}</pre>")
        body.append(_html_table(result))
    return f"{_HTML_HEAD}<body>{''.join(body)}</body></html>\n"


def build_report(
    job_dirs: list[str] | list[Path],
    baseline: str | None = None,
    console: Console | None = None,
    out_dir: Path | None = None,
) -> Path:
    """Run every query, print Rich tables, write report.md, PNGs and report.html; returns report.md."""
    job_dirs = [str(d) for d in job_dirs]
    out_dir = Path(out_dir) if out_dir is not None else default_out_dir(job_dirs[0])
    out_dir.mkdir(parents=True, exist_ok=True)
    console = console or Console()
    con = connect(job_dirs, baseline)
    results = run_queries(con)
    tables = [results[name] for name in QUERIES]
    for result in tables:
        console.print(rich_table(result))
    plots = [draw(results, out_dir) for draw in PLOTS]
    report_md = out_dir / "report.md"
    out = open_storage(out_dir)  # each file written whole and renamed: a planted link is replaced, not followed
    out.write_bytes("report.md", render_markdown(job_dirs, tables, plots).encode(), durable=False)
    out.write_bytes("report.html", render_html(job_dirs, tables, plots).encode(), durable=False)
    log.info("wrote %s, report.html and %d plots", report_md, len(plots))
    return report_md


def default_out_dir(job_dir: str) -> Path:
    """A local job's own directory; `reports/JOB_ID` here for a job on an object store."""
    return Path("reports") / location_name(job_dir) if is_url(job_dir) else Path(job_dir)
