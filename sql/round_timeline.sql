-- Per-round timeline for plots: round_number orders a job's rounds by start (all workers), t_s is
-- time since its first round; mean_k = num_proposed / num_speculating_rows (NULL: none speculated).
SELECT job_id, worker_id, run_id, round_index,
       row_number() OVER (PARTITION BY job_id ORDER BY started_s, worker_id) AS round_number,
       started_s - min(started_s) OVER (PARTITION BY job_id) AS t_s,
       num_batch_rows, num_bucket_rows, num_speculating_rows,
       num_proposed / nullif(num_speculating_rows, 0) AS mean_k,
       num_committed, round_ms
FROM rounds
ORDER BY job_id, started_s, worker_id;
