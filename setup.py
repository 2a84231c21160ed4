"""The one build step pyproject.toml cannot declare: the wheel ships the top-level `sql/` queries as
`specbatch/sql/` (one copy in the repository, where users run them from the duckdb CLI; the package
reads them there in a source checkout, `specbatch.report.sql_dir`)."""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

SQL = Path(__file__).resolve().parent / "sql"


class BuildPyWithSql(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "specbatch" / "sql"
        target.mkdir(parents=True, exist_ok=True)
        for query in sorted(SQL.glob("*.sql")):
            shutil.copyfile(query, target / query.name)


setup(cmdclass={"build_py": BuildPyWithSql})
