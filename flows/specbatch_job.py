"""Entry point of the `specbatch-job` flow for `prefect.yaml`; the flow itself is `specbatch.job.flow`."""

from specbatch.job.flow import specbatch_job

__all__ = ["specbatch_job"]
