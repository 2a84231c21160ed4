"""`python -m specbatch.cli`: the same app as the `specbatch` command."""

from specbatch.cli import app

app()
