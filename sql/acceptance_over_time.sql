-- Acceptance over time: rounds in num_time_bins equal bins (variable, default 20) of the span
-- from a job's first round start to its last round start. Bin b holds rounds with
-- floor((started_s - t0) / bin_s) = b (the last start goes into the last bin).
WITH bounds AS (
    SELECT job_id, min(started_s) AS t0,
           greatest(max(started_s) - min(started_s), 1e-9) / coalesce(getvariable('num_time_bins'), 20) AS bin_s,
           coalesce(getvariable('num_time_bins'), 20) AS num_bins
    FROM rounds GROUP BY job_id
), binned AS (
    SELECT r.*, b.bin_s,
           least(floor((r.started_s - b.t0) / b.bin_s), b.num_bins - 1)::BIGINT AS time_bin
    FROM rounds r JOIN bounds b USING (job_id)
)
SELECT job_id,
       time_bin,
       time_bin * any_value(bin_s) AS bin_start_s,
       count(*) AS num_rounds,
       sum(num_proposed) AS num_proposed,
       sum(num_accepted) AS num_accepted,
       sum(num_committed) AS num_committed,
       sum(num_accepted) / nullif(sum(num_proposed), 0) AS acceptance_rate,
       sum(num_committed) / nullif(sum(num_target_passes), 0) AS committed_per_target_pass
FROM binned
GROUP BY job_id, time_bin
ORDER BY job_id, time_bin;
