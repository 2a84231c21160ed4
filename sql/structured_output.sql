-- Structured output (issue 42): what the grammar masks cost and what forced drafts gave, per job.
-- mask_ms: filling the verify positions' masks on CPU threads beside the target pass (hidden while
-- the pass takes longer); mask_wait_ms: the rounds' wait for them and applying them, the overhead
-- not hidden (overhead_share: of round time). Forced drafts: tokens the grammar forced (a single
-- continuation) proposed as drafts, their share of the proposed drafts and, accepted, of the
-- committed tokens. Jobs none of whose rounds masked or forced anything are left out.
SELECT job_id,
       count(*) FILTER (WHERE mask_ms > 0) AS num_masked_rounds,
       sum(mask_ms) AS mask_ms,
       sum(mask_wait_ms) AS mask_wait_ms,
       sum(mask_wait_ms) / nullif(sum(round_ms), 0) AS overhead_share,
       sum(mask_ms) / nullif(sum(verify_ms) FILTER (WHERE mask_ms > 0), 0) AS mask_to_verify,
       sum(num_forced_proposed) AS num_forced_proposed,
       sum(num_forced_accepted) AS num_forced_accepted,
       sum(num_forced_proposed) / nullif(sum(num_proposed), 0) AS forced_share_of_proposed,
       sum(num_forced_accepted) / nullif(sum(num_committed), 0) AS forced_share_of_committed
FROM rounds
GROUP BY job_id
HAVING sum(mask_ms) > 0 OR sum(num_forced_proposed) > 0
ORDER BY job_id;
