-- Requests that did not complete, by status and reason (from results: every input record once).
-- reason is drop_reason, else finish_reason, else 'unspecified'; share is of the job's records.
WITH totals AS (
    SELECT job_id, count(*) AS num_records FROM results GROUP BY job_id
)
SELECT r.job_id,
       r.status,
       coalesce(r.drop_reason, r.finish_reason, 'unspecified') AS reason,
       count(*) AS num_requests,
       sum(r.num_output_tokens) AS num_output_tokens,
       count(*) / any_value(t.num_records) AS share_of_records,
       min(r.drop_message) AS example_message
FROM results r JOIN totals t USING (job_id)
WHERE r.status <> 'completed'
GROUP BY r.job_id, r.status, reason
ORDER BY r.job_id, r.status, num_requests DESC, reason;
