-- Acceptance by draft position j (1-based), from steps. Drafts are accepted as a prefix, so
-- position j was proposed iff num_proposed >= j and accepted iff num_accepted >= j.
--   acceptance_rate   accepted at j / proposed at j
--   conditional_rate  accepted at j / (proposed at j and accepted at j - 1): the chance the j-th
--                     draft survives once the drafts before it did
SELECT job_id,
       j AS position,
       count(*) AS num_proposed,
       count_if(num_accepted >= j) AS num_accepted,
       count_if(num_accepted >= j) / count(*) AS acceptance_rate,
       count_if(num_accepted >= j) / nullif(count_if(num_accepted >= j - 1), 0) AS conditional_rate
FROM steps CROSS JOIN LATERAL (SELECT unnest(range(1, num_proposed + 1)) AS j)
GROUP BY job_id, j
ORDER BY job_id, j;
