-- Shared prefixes computed once (cache.prefix), per job: the share of requests that copied a prefix
-- (hit_rate), prompt positions copied instead of computed and prefilled, what prefill and the copies
-- cost, and the prefill share of engine time. engine_ms_saved is an estimate: the copied positions
-- priced at the job's own measured prefill ms per computed position, less the copies' time.
-- prefill_padding_share: positions the prefill passes computed only to pad rows to one length.
WITH req AS (
    SELECT job_id,
           count(*) AS num_requests,
           count(*) FILTER (WHERE num_reused_tokens > 0) AS num_hits,
           sum(num_prompt_tokens) AS num_prompt_tokens,
           sum(num_reused_tokens) AS num_reused_tokens
    FROM requests
    WHERE status <> 'dropped'
    GROUP BY job_id
), rnd AS (
    SELECT job_id,
           sum(num_prefill_tokens) AS num_prefill_tokens,
           sum(num_padded_prefill_rows) AS num_padded_prefill_rows,
           sum(prefill_ms) AS prefill_ms,
           sum(reuse_ms) AS reuse_ms,
           sum(round_ms) AS round_ms
    FROM rounds
    GROUP BY job_id
)
SELECT req.job_id,
       num_requests,
       num_hits / nullif(num_requests, 0) AS hit_rate,
       num_prompt_tokens,
       num_reused_tokens,
       num_prefill_tokens,
       num_reused_tokens / nullif(num_prompt_tokens, 0) AS reused_share,
       num_prefill_tokens / nullif(num_prompt_tokens, 0) AS prefilled_share,
       prefill_ms / nullif(num_prefill_tokens, 0) AS prefill_ms_per_token,
       reuse_ms / nullif(num_reused_tokens, 0) AS reuse_ms_per_token,
       num_reused_tokens * prefill_ms / nullif(num_prefill_tokens, 0) - reuse_ms AS engine_ms_saved,
       prefill_ms / nullif(round_ms, 0) AS prefill_share,
       num_padded_prefill_rows / nullif(num_prefill_tokens + num_padded_prefill_rows, 0) AS prefill_padding_share
FROM req JOIN rnd USING (job_id)
ORDER BY req.job_id;
