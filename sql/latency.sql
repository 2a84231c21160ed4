-- Latency percentiles per job and metric over completed requests (definitions: latency_samples
-- in views.sql). Quantiles interpolate linearly (quantile_cont). Requests that did not complete
-- are left out of every figure, and each row says how many: num_left_out = dropped + cancelled
-- (+ any other status), counted from results so that records dropped before the engine count too.
WITH counts AS (
    SELECT job_id,
           count_if(status = 'completed') AS num_included,
           count_if(status <> 'completed') AS num_left_out,
           count_if(status = 'dropped') AS num_dropped_left_out,
           count_if(status = 'cancelled') AS num_cancelled_left_out
    FROM results GROUP BY job_id
), metrics(metric, metric_order) AS (
    VALUES ('queue_s', 0), ('ttft_s', 1), ('gap_per_emission_s', 2), ('gap_per_token_s', 3),
           ('tpot_s', 4), ('completion_s', 5)
), stats AS (
    SELECT job_id, metric,
           count(*) AS num_samples,
           quantile_cont(value_s, 0.5) AS p50_s,
           quantile_cont(value_s, 0.9) AS p90_s,
           quantile_cont(value_s, 0.99) AS p99_s,
           avg(value_s) AS mean_s,
           max(value_s) AS max_s
    FROM latency_samples GROUP BY job_id, metric
)
SELECT c.job_id, m.metric,
       coalesce(s.num_samples, 0) AS num_samples,
       s.p50_s, s.p90_s, s.p99_s, s.mean_s, s.max_s,
       c.num_included, c.num_left_out, c.num_dropped_left_out, c.num_cancelled_left_out
FROM counts c
CROSS JOIN metrics m
LEFT JOIN stats s ON s.job_id = c.job_id AND s.metric = m.metric
ORDER BY c.job_id, m.metric_order;
