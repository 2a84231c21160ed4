"""Entry point of the `specbatch-job` flow for `prefect.yaml`; the flow itself is `specbatch.flow`."""

from specbatch.flow import specbatch_job

__all__ = ["specbatch_job"]
