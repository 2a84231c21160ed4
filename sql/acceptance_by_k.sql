-- Acceptance by lookahead k, from steps (k = 0 rows decode plainly: no rate).
--   committed_per_step  tokens a row gets per round at this k
SELECT job_id,
       k,
       count(*) AS num_steps,
       sum(num_proposed) AS num_proposed,
       sum(num_accepted) AS num_accepted,
       sum(num_committed) AS num_committed,
       sum(num_accepted) / nullif(sum(num_proposed), 0) AS acceptance_rate,
       sum(num_committed) / count(*) AS committed_per_step
FROM steps
GROUP BY job_id, k
ORDER BY job_id, k;
