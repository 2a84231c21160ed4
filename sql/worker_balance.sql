-- Per-worker balance. busy_s = Σ round_ms / 1000 of the worker's rounds;
--   busy_fraction  busy_s / the job's wall_s (job_wall in views.sql)
--   busy_vs_mean   busy_s / mean busy_s over the job's workers (1.0 = perfectly even)
--   idle_at_end_s  the job's last round end minus this worker's
WITH w AS (
    SELECT job_id, worker_id,
           count(*) AS num_rounds,
           sum(num_committed) AS num_committed,
           sum(round_ms) / 1000.0 AS busy_s,
           max(started_s + round_ms / 1000.0) AS last_finished_s
    FROM rounds GROUP BY job_id, worker_id
), q AS (
    SELECT job_id, worker_id,
           count(*) AS num_requests,
           count_if(status = 'completed') AS num_completed
    FROM requests GROUP BY job_id, worker_id
)
SELECT job_id, worker_id,
       coalesce(q.num_requests, 0) AS num_requests,
       coalesce(q.num_completed, 0) AS num_completed,
       coalesce(w.num_rounds, 0) AS num_rounds,
       coalesce(w.num_committed, 0) AS num_committed,
       coalesce(w.busy_s, 0.0) AS busy_s,
       w.busy_s / nullif(j.wall_s, 0) AS busy_fraction,
       w.busy_s / nullif(avg(w.busy_s) OVER (PARTITION BY job_id), 0) AS busy_vs_mean,
       w.num_committed / nullif(sum(w.num_committed) OVER (PARTITION BY job_id), 0) AS committed_share,
       j.last_finished_s - w.last_finished_s AS idle_at_end_s
FROM w FULL JOIN q USING (job_id, worker_id)
LEFT JOIN job_wall j USING (job_id)
ORDER BY job_id, worker_id;
