-- What speculation got against what it could have (issue 43), per job, over rounds with decode rows.
-- Every round records the round-time model's view of its decode rows (sched/pass_profile.py): their
-- time at k = 0 (plain_ms) and as planned (predicted_ms), and the speedup over plain decoding their
-- measured α allowed at the best largest k, (1 − α^(k+1)) / (1 − α) over the verify/plain cost ratio
-- (limit_speedup). A round's work is its rows' plain decoding, so a job's figures weigh rounds by it:
--   limit_speedup     Σ plain_ms / Σ (plain_ms / limit): the job's rounds, each at its limit
--   planned_speedup   tokens per predicted ms over plain decoding's rows per plain ms: what the plans got
--                     at the model's prices (the policy's choices and the realised α, not the clock)
--   measured_speedup  the same over measured decode time (round less prefill, reuse and warm-up)
--   realised_of_limit planned_speedup / limit_speedup (1: every round at its limit)
WITH decode AS (
    SELECT * FROM rounds WHERE num_decode_rows > 0 AND plain_ms > 0
)
SELECT job_id,
       count(*) AS num_rounds,
       sum(plain_ms) / sum(plain_ms / limit_speedup) AS limit_speedup,
       (sum(num_committed) / sum(predicted_ms)) / (sum(num_decode_rows) / sum(plain_ms)) AS planned_speedup,
       (sum(num_committed) / nullif(sum(round_ms - prefill_ms - coalesce(reuse_ms, 0) - coalesce(warmup_ms, 0)), 0))
           / (sum(num_decode_rows) / sum(plain_ms)) AS measured_speedup,
       (sum(num_committed) / sum(predicted_ms)) / (sum(num_decode_rows) / sum(plain_ms))
           / (sum(plain_ms) / sum(plain_ms / limit_speedup)) AS realised_of_limit
FROM decode
GROUP BY job_id
ORDER BY job_id;
