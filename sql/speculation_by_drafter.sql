-- Speculation per drafter (issue 43): a job of several drafters (drafter.kind: suffix,ngram,...)
-- picks one per row and round (steps.drafter; '' in a job of one drafter, 'none' where the row was
-- planned no drafts). Per step, its round's cost ratio (predicted_ms / plain_ms) and limit_speedup:
--   proposed_share     of the drafter's steps, those that proposed drafts (a lookup may match nothing)
--   alpha              accepted / (accepted + rounds ended by a rejection): the censored-geometric MLE
--   realised_speedup   committed per step / the mean cost ratio of its rounds
--   limit_speedup      the mean limit of the rounds its steps were in
--   realised_of_limit  realised_speedup / limit_speedup
WITH s AS (
    SELECT s.job_id, CASE WHEN s.k = 0 THEN 'none' ELSE coalesce(s.drafter, '') END AS drafter,
           s.num_proposed, s.num_accepted, s.num_committed,
           r.predicted_ms / r.plain_ms AS cost_ratio, r.limit_speedup
    FROM steps s
    JOIN rounds r ON s.job_id = r.job_id AND s.run_id IS NOT DISTINCT FROM r.run_id
                 AND s.worker_id = r.worker_id AND s.round_index = r.round_index
    WHERE r.plain_ms > 0
)
SELECT job_id, drafter,
       count(*) AS num_steps,
       sum(num_proposed) AS num_proposed,
       avg((num_proposed > 0)::INTEGER) AS proposed_share,
       sum(num_accepted) / nullif(sum(num_accepted) + sum((num_accepted < num_proposed)::INTEGER), 0) AS alpha,
       avg(num_committed) / avg(cost_ratio) AS realised_speedup,
       avg(limit_speedup) AS limit_speedup,
       avg(num_committed) / avg(cost_ratio) / avg(limit_speedup) AS realised_of_limit
FROM s
GROUP BY job_id, drafter
ORDER BY job_id, drafter;
