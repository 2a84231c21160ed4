"""The `specbatch` command line: one Typer app made of the command groups in this package.

Each module owns one group (`job`, `report`, `lab`, `models`); `common` holds the consoles, the
exit-code table and the one error printer. Commands parse, call into `specbatch`, print.
"""

from __future__ import annotations

import typer

from specbatch.cli import job, lab, models, report

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Offline batch inference with exact, well-scheduled speculative decoding.")
app.add_typer(job.commands)  # submit, status
app.add_typer(report.commands)  # report
app.add_typer(lab.commands)  # bench, calibrate, simulate, queue-lab
app.add_typer(models.commands)  # models path, models train-demo
