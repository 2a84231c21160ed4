-- Where round time goes, per job: each phase's Σ ms / Σ round_ms. plan_share is the scheduler
-- overhead; warmup_share is graph capture (models.graphs; null in parts written before it existed);
-- reuse_share is copying shared prefixes' KV (cache.prefix; null in parts written before it existed);
-- other_share is round time outside the named phases (ledger writes, Python glue).
SELECT job_id,
       count(*) AS num_rounds,
       sum(round_ms) AS round_ms,
       sum(plan_ms) AS plan_ms,
       sum(plan_ms) / nullif(sum(round_ms), 0) AS plan_share,
       coalesce(sum(reuse_ms), 0) / nullif(sum(round_ms), 0) AS reuse_share,
       sum(prefill_ms) / nullif(sum(round_ms), 0) AS prefill_share,
       sum(draft_ms) / nullif(sum(round_ms), 0) AS draft_share,
       sum(verify_ms) / nullif(sum(round_ms), 0) AS verify_share,
       sum(commit_ms) / nullif(sum(round_ms), 0) AS commit_share,
       coalesce(sum(warmup_ms), 0) / nullif(sum(round_ms), 0) AS warmup_share,
       1 - sum(plan_ms + coalesce(reuse_ms, 0) + prefill_ms + draft_ms + verify_ms + commit_ms
               + coalesce(warmup_ms, 0))
           / nullif(sum(round_ms), 0) AS other_share,
       avg(plan_ms) AS mean_plan_ms,
       quantile_cont(plan_ms, 0.99) AS p99_plan_ms
FROM rounds
GROUP BY job_id
ORDER BY job_id;
