-- Acceptance by domain, from per-request totals (all statuses; a dropped request adds no tokens).
--   acceptance_rate         Σ accepted / Σ proposed
--   output_tokens_per_round Σ output tokens / Σ rounds the requests took part in
SELECT job_id,
       domain,
       count(*) AS num_requests,
       count_if(status = 'completed') AS num_completed,
       sum(num_output_tokens) AS num_output_tokens,
       sum(num_proposed) AS num_proposed,
       sum(num_accepted) AS num_accepted,
       sum(num_accepted) / nullif(sum(num_proposed), 0) AS acceptance_rate,
       sum(num_output_tokens) / nullif(sum(num_rounds), 0) AS output_tokens_per_round
FROM requests
GROUP BY job_id, domain
ORDER BY job_id, domain;
