-- KV blocks per job (sched/kv_blocks.py): what the paged cache held and how much of it rows shared.
-- Per job, over rounds: mean and peak blocks in use (a shared block once), mean blocks shared by
-- several rows and cached for later ones, blocks evicted, and the sharing factor: block-table
-- entries over blocks in use (what the rows would hold, each with its own copy, per block held).
-- padded_share: positions the target computed only to pad a pass (flat passes pad none).
SELECT job_id,
       count(*) AS num_rounds,
       avg(kv_blocks_in_use) AS mean_blocks_in_use,
       max(kv_blocks_in_use) AS peak_blocks_in_use,
       avg(kv_blocks_shared) AS mean_blocks_shared,
       avg(kv_blocks_cached) AS mean_blocks_cached,
       sum(kv_blocks_evicted) AS num_blocks_evicted,
       sum(kv_blocks_referenced) / nullif(sum(kv_blocks_in_use), 0) AS sharing_factor,
       sum(num_padded_target_rows) / nullif(sum(num_target_rows + num_padded_target_rows), 0) AS padded_share
FROM rounds
GROUP BY job_id
ORDER BY job_id;
