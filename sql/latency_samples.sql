-- Every latency sample of completed requests (definitions in views.sql), for the CDF plots.
SELECT job_id, metric, value_s FROM latency_samples ORDER BY job_id, metric, value_s;
