-- Views over one job directory or many; every query in sql/ runs after this file.
--
--   SET VARIABLE job_dir = 'outputs/J';            -- one job
--   SET VARIABLE job_dir = 'outputs/*';            -- a glob compares jobs
--   SET VARIABLE job_dir = 'outputs/A,outputs/B';  -- or a comma-separated list
--
-- Every table view has job_id (the job directory's name), part (the part file's name) and run_id
-- (from the part name `part-wNN-RUN-SEQ`). A part counts only once its results file exists (the
-- ledger's commit point), so files of a part killed mid-flush are ignored even before a resume
-- removes them. Each job needs at least one committed part (the ledger writes all four tables per
-- part, empty ones included); `specbatch report` checks this before it runs the views.
--
--   SET VARIABLE ledger_parts = ['outputs/J/{table}/part-w00-R-00000.parquet', ...];  -- optional
--
-- `specbatch report` sets ledger_parts to the parts the ledger counts (`ledger.committed_parts`): on
-- an object store not a stale lease holder's fenced-out parts, and never a damaged file. Without it,
-- every part whose results file exists counts.

CREATE OR REPLACE MACRO ledger_globs(tbl) AS
    CASE WHEN getvariable('ledger_parts') IS NULL
         THEN [rtrim(trim(d), '/') || '/' || tbl || '/*.parquet' FOR d IN string_split(getvariable('job_dir'), ',')]
         ELSE [replace(p, '{table}', tbl) FOR p IN getvariable('ledger_parts')] END;

CREATE OR REPLACE MACRO ledger_table(tbl) AS TABLE
    SELECT
        regexp_extract(filename, '([^/]+)/+' || tbl || '/+[^/]+$', 1) AS job_id,
        regexp_extract(filename, '([^/]+)\.parquet$', 1) AS part,
        nullif(regexp_extract(filename, 'part-w\d+-(.+)-\d+\.parquet$', 1), '') AS run_id,
        * EXCLUDE (filename)
    FROM read_parquet(ledger_globs(tbl), filename = true, union_by_name = true);

CREATE OR REPLACE VIEW committed_parts AS
    SELECT
        regexp_extract(file, '([^/]+)/+results/+[^/]+$', 1) AS job_id,
        regexp_extract(file, '([^/]+)\.parquet$', 1) AS part
    FROM glob(ledger_globs('results'));

CREATE OR REPLACE VIEW results AS SELECT * FROM ledger_table('results');

-- Columns added after the first parts were written read as NULL in older parts (and in jobs whose
-- parts all predate them): each is declared once here, unioned by name with the parts.
CREATE OR REPLACE VIEW requests AS
    WITH t AS (
        SELECT NULL::BIGINT AS num_reused_tokens WHERE false
        UNION ALL BY NAME SELECT * FROM ledger_table('requests')
    )
    SELECT * FROM t
    WHERE EXISTS (SELECT 1 FROM committed_parts c WHERE c.job_id = t.job_id AND c.part = t.part);

CREATE OR REPLACE VIEW rounds AS
    WITH t AS (
        SELECT NULL::BIGINT AS num_reused_tokens, NULL::BIGINT AS num_padded_prefill_rows,
               NULL::DOUBLE AS reuse_ms, NULL::DOUBLE AS warmup_ms,
               NULL::DOUBLE AS plain_ms, NULL::DOUBLE AS predicted_ms, NULL::DOUBLE AS limit_speedup,
               NULL::DOUBLE AS mask_ms, NULL::DOUBLE AS mask_wait_ms, NULL::BIGINT AS num_forced_proposed, NULL::BIGINT AS num_forced_accepted,
               NULL::BIGINT AS num_lookup_rows, NULL::BIGINT AS num_indexed_tokens,
               NULL::BIGINT AS num_wide_kv_tokens_read
        WHERE false
        UNION ALL BY NAME SELECT * FROM ledger_table('rounds')
    )
    SELECT * FROM t
    WHERE EXISTS (SELECT 1 FROM committed_parts c WHERE c.job_id = t.job_id AND c.part = t.part);

CREATE OR REPLACE VIEW steps AS
    WITH t AS (
        SELECT NULL::VARCHAR AS drafter WHERE false
        UNION ALL BY NAME SELECT * FROM ledger_table('steps')
    )
    SELECT * FROM t
    WHERE EXISTS (SELECT 1 FROM committed_parts c WHERE c.job_id = t.job_id AND c.part = t.part);

-- Wall time of a job: the union, over (run, worker), of [first round start, last round end].
-- Time between runs of a resumed job and time before the first round (ingest, model load) is
-- not counted; idle time of a worker between its own rounds is.
CREATE OR REPLACE VIEW job_wall AS
    WITH spans AS (
        SELECT job_id, run_id, worker_id,
               min(started_s) AS start_s, max(started_s + round_ms / 1000.0) AS end_s
        FROM rounds GROUP BY job_id, run_id, worker_id
    ), marked AS (
        SELECT *, coalesce(start_s > max(end_s) OVER (
                   PARTITION BY job_id ORDER BY start_s, end_s
                   ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), true) AS is_new
        FROM spans
    ), islands AS (
        SELECT job_id, start_s, end_s,
               sum(is_new::INTEGER) OVER (PARTITION BY job_id ORDER BY start_s, end_s ROWS UNBOUNDED PRECEDING)
                   AS island
        FROM marked
    ), merged AS (
        SELECT job_id, island, min(start_s) AS start_s, max(end_s) AS end_s FROM islands GROUP BY job_id, island
    )
    SELECT job_id, sum(end_s - start_s) AS wall_s, min(start_s) AS first_started_s,
           max(end_s) AS last_finished_s, count(*) AS num_active_spans
    FROM merged GROUP BY job_id;

-- One row per latency sample of a completed request (metric, value_s). An *emission* is a step
-- that committed tokens; steps count only from the run that finished the request (a crash's
-- earlier attempt is wasted work, not latency). Metrics:
--   queue_s             admitted_s - arrival_s
--   ttft_s              first_token_s - arrival_s
--   completion_s        finished_s - arrival_s
--   gap_per_emission_s  time between consecutive emissions of a request
--   gap_per_token_s     per output token after the first: the first token of an emission waits
--                       the emission gap, the other tokens of the same emission arrive with it (0)
--   tpot_s              (finished_s - first_token_s) / (num_output_tokens - 1): the usual average,
--                       for comparison only; it hides the pauses between emissions
CREATE OR REPLACE VIEW latency_samples AS
    WITH done AS (
        SELECT * FROM requests WHERE status = 'completed'
    ), emissions AS (
        SELECT s.job_id, s.request_id, s.num_committed,
               s.emitted_s - lag(s.emitted_s) OVER (
                   PARTITION BY s.job_id, s.request_id ORDER BY s.emitted_s, s.round_index) AS gap_s
        FROM steps s
        JOIN done r ON s.job_id = r.job_id AND s.request_id = r.request_id AND s.run_id = r.run_id
        WHERE s.num_committed > 0
    )
    SELECT job_id, request_id, 'queue_s' AS metric, admitted_s - arrival_s AS value_s
        FROM done WHERE admitted_s IS NOT NULL
    UNION ALL SELECT job_id, request_id, 'ttft_s', first_token_s - arrival_s
        FROM done WHERE first_token_s IS NOT NULL
    UNION ALL SELECT job_id, request_id, 'completion_s', finished_s - arrival_s FROM done
    UNION ALL SELECT job_id, request_id, 'tpot_s', (finished_s - first_token_s) / (num_output_tokens - 1)
        FROM done WHERE first_token_s IS NOT NULL AND num_output_tokens > 1
    UNION ALL SELECT job_id, request_id, 'gap_per_emission_s', gap_s
        FROM emissions WHERE gap_s IS NOT NULL
    UNION ALL SELECT job_id, request_id, 'gap_per_token_s', CASE WHEN i = 0 THEN gap_s ELSE 0.0 END
        FROM emissions CROSS JOIN LATERAL (SELECT unnest(range(num_committed)) AS i)
        WHERE i > 0 OR gap_s IS NOT NULL;
