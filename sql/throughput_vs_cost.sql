-- Throughput versus cost, one row per job. Every rate is derived here from raw counters.
--   committed_tokens_per_s   Σ num_committed over rounds / job_wall.wall_s (see views.sql)
--   *_per_1k                 a counter per 1,000 committed tokens
--   device_s_per_1k          Σ round_ms / 1000 over all rounds of all workers, per 1,000 tokens
--   speedup                  committed_tokens_per_s / the baseline job's; the baseline is the
--                            variable baseline_job (SET VARIABLE baseline_job = 'J'), else the first
--                            job_id in sort order
--   device_cost_ratio, target_pass_ratio: the same per-1k costs divided by the baseline's
WITH work AS (
    SELECT job_id,
           count(*) AS num_rounds,
           sum(num_committed) AS num_committed,
           sum(num_target_passes) AS num_target_passes,
           sum(num_target_rows) AS num_target_rows,
           sum(num_padded_target_rows) AS num_padded_target_rows,
           sum(num_draft_passes) AS num_draft_passes,
           sum(num_draft_rows) AS num_draft_rows,
           sum(num_padded_draft_rows) AS num_padded_draft_rows,
           sum(num_proposed) AS num_proposed,
           sum(num_accepted) AS num_accepted,
           sum(num_kv_tokens_read) AS num_kv_tokens_read,
           sum(kv_tokens_in_use) AS kv_token_rounds_in_use,
           sum(kv_tokens_capacity) AS kv_token_rounds_capacity,
           sum(round_ms) / 1000.0 AS device_s
    FROM rounds GROUP BY job_id
), outcome AS (
    SELECT job_id,
           count(*) AS num_records,
           count_if(status = 'completed') AS num_completed,
           count_if(status = 'dropped') AS num_dropped,
           count_if(status = 'cancelled') AS num_cancelled
    FROM results GROUP BY job_id
), per_job AS (
    SELECT o.*,
           coalesce(w.num_rounds, 0) AS num_rounds,
           coalesce(w.num_committed, 0) AS num_committed,
           coalesce(j.wall_s, 0.0) AS wall_s,
           coalesce(w.device_s, 0.0) AS device_s,
           w.num_committed / nullif(j.wall_s, 0) AS committed_tokens_per_s,
           1000.0 * w.num_target_passes / nullif(w.num_committed, 0) AS target_passes_per_1k,
           1000.0 * w.num_target_rows / nullif(w.num_committed, 0) AS target_rows_per_1k,
           1000.0 * w.num_draft_passes / nullif(w.num_committed, 0) AS draft_passes_per_1k,
           1000.0 * w.num_draft_rows / nullif(w.num_committed, 0) AS draft_rows_per_1k,
           1000.0 * w.num_padded_target_rows / nullif(w.num_committed, 0) AS padded_target_rows_per_1k,
           1000.0 * w.num_padded_draft_rows / nullif(w.num_committed, 0) AS padded_draft_rows_per_1k,
           1000.0 * w.device_s / nullif(w.num_committed, 0) AS device_s_per_1k,
           1000.0 * w.num_kv_tokens_read / nullif(w.num_committed, 0) AS kv_tokens_read_per_1k,
           w.num_committed / nullif(w.num_target_passes, 0) AS committed_per_target_pass,
           w.num_accepted / nullif(w.num_proposed, 0) AS acceptance_rate,
           w.kv_token_rounds_in_use / nullif(w.kv_token_rounds_capacity, 0) AS kv_occupancy
    FROM outcome o
    LEFT JOIN work w USING (job_id)
    LEFT JOIN job_wall j USING (job_id)
), baseline AS (
    SELECT * FROM per_job
    WHERE job_id = coalesce(getvariable('baseline_job'), (SELECT min(job_id) FROM per_job))
)
SELECT p.*,
       b.job_id AS baseline_job,
       p.committed_tokens_per_s / nullif(b.committed_tokens_per_s, 0) AS speedup,
       p.device_s_per_1k / nullif(b.device_s_per_1k, 0) AS device_cost_ratio,
       p.target_passes_per_1k / nullif(b.target_passes_per_1k, 0) AS target_pass_ratio
FROM per_job p LEFT JOIN baseline b ON true
ORDER BY p.job_id;
