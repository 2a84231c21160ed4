-- Per-round timeline for plots: t_s since the job's first round; mean_k = num_proposed /
-- num_speculating_rows (NULL when no row speculated).
SELECT job_id, worker_id, run_id, round_index,
       started_s - min(started_s) OVER (PARTITION BY job_id) AS t_s,
       num_batch_rows, num_bucket_rows, num_speculating_rows,
       num_proposed / nullif(num_speculating_rows, 0) AS mean_k,
       num_committed, round_ms
FROM rounds
ORDER BY job_id, started_s, worker_id;
