"""Unusable input is refused with one `error:` line and exit 2, a stop is exit 130 at any stage, and
nothing hangs (issue 36): bad `--set` YAML, a FIFO or a compressed file as the dataset, a changed
`--column` on a resume, `status` of an object-store job without credentials, SIGTERM during ingest."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from job_helpers import write_config, write_jsonl

from specbatch.config import ConfigError, load_config
from specbatch.data.ingest import DatasetError, resolve_dataset
from specbatch.job.inputs import JobError


def _cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specbatch.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env={**os.environ, "COLUMNS": "200", **(env or {})})


def _one_error_line(done: subprocess.CompletedProcess, code: int = 2) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1 and lines[0].startswith("error:"), done.stdout + done.stderr
    return lines[0]


@pytest.mark.parametrize("override", ["seed=[1,", "models.target=a: b: c"])
def test_a_set_value_that_is_not_yaml_is_a_config_error(override):
    with pytest.raises(ConfigError, match="is not a valid YAML value"):
        load_config(None, [override])


@pytest.mark.parametrize(("override", "message"), [
    ("io.part_every_s=.inf", "io.part_every_s: Input should be a finite number"),  # was exit 1 on the manifest's null
    ("scheduler.tpot_slo_ms=.nan", "finite number"), ("sampling.temperature=.inf", "finite number"),
    ("sampling.temperature=101", "less than or equal to 100"),  # a record's own temperature is held to it
    ("sampling.max_new_tokens=99999999999", "less than or equal to 131072"),  # was exit 1: past the int32 shard column
])
def test_a_set_value_past_what_a_job_can_hold_is_a_config_error(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize("override", ["scheduler.max_batch_rows=true", "io.part_every_s=false", "seed=true",
                                      "sampling.temperature=true", "buckets.batch_rows=[8, true]"])
def test_a_boolean_for_a_number_is_a_config_error_not_1(override):
    """pydantic reads `true` as 1 for an int or float field: max_batch_rows=true ran one row per batch."""
    with pytest.raises(ConfigError, match="expected a number, not a boolean"):
        load_config(None, [override])


def test_booleans_and_numbers_still_load_where_they_belong():
    config = load_config(None, ["models.native=false", "cache.prefix=true", "scheduler.max_batch_rows=4",
                                "buckets.batch_rows=[8, 16]", "sampling.temperature=0", "capacity.kv_tokens=null"])
    assert (config.models.native, config.cache.prefix, config.scheduler.max_batch_rows) == (False, True, 4)
    assert (config.buckets.batch_rows, config.sampling.temperature, config.capacity.kv_tokens) == ((8, 16), 0.0, None)


def test_bad_set_yaml_through_the_cli_is_one_line_and_exit_2(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    assert "seed" in _one_error_line(_cli("submit", str(data), "--set", "seed=[1,", cwd=tmp_path))


def test_an_empty_job_id_is_refused_not_replaced_by_a_generated_one(tmp_path):
    """`--job-id ""` (a script's unset variable) ran the job under a new `job-<time>` id, so a resume
    with the same command started another job."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    assert "job id is empty" in _one_error_line(_cli("submit", str(data), "--job-id", "", cwd=tmp_path))
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(("flag", "message"), [
    ("--output", "--output is empty"),  # was outputs/
    ("--format", "unknown dataset format ''"),  # was the format detected from the name
    ("--config", "cannot read config file .: [Errno 21] Is a directory"),  # was a traceback
])
def test_an_empty_path_or_format_flag_is_refused_not_read_as_its_default(tmp_path, flag, message):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    assert message in _one_error_line(_cli("submit", str(data), "--job-id", "j", flag, "", cwd=tmp_path))
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize("output", ["a-file", "a-file/jobs"])
def test_an_output_folder_under_a_file_is_refused_before_the_job_starts(tmp_path, output):
    """`--output` naming a file (or a folder below one) was a NotADirectoryError traceback from
    Prefect's state folder, exit 1."""
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    (tmp_path / "a-file").write_text("not a folder")
    line = _one_error_line(_cli("submit", str(data), "--job-id", "j", "--output", output, cwd=tmp_path))
    assert f"--output {output}: a-file is a file, not a folder" in line
    assert (tmp_path / "a-file").read_text() == "not a folder"


def test_a_config_file_that_is_not_text_is_a_config_error(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_bytes(b"\xff\xfe\x00seed: 1")
    with pytest.raises(ConfigError, match="cannot read config file .*c.yaml"):
        load_config(config)


def test_a_field_mapped_twice_is_refused_not_settled_by_the_last(tmp_path):
    """`--column prompt=text --column prompt=label` ran every record on `label`, silently."""
    data = tmp_path / "d.csv"
    data.write_text("text,label\nhello,1\n")
    line = _one_error_line(_cli("submit", str(data), "--column", "prompt=text", "--column", "prompt=label",
                                cwd=tmp_path))
    assert "--column maps prompt more than once" in line
    assert not (tmp_path / "outputs").exists()


def test_a_fifo_dataset_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "prompts.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(DatasetError, match="not a regular file or a folder"):
        resolve_dataset(str(fifo))


def test_a_compressed_file_named_jsonl_is_refused(tmp_path):
    packed = tmp_path / "prompts.jsonl"
    packed.write_bytes(gzip.compress(b'{"prompt": "hi"}\n'))
    with pytest.raises(DatasetError, match="gzip-compressed; decompress it"):
        resolve_dataset(str(packed))


def test_status_of_an_object_store_job_without_credentials_is_one_line(tmp_path):
    no_credentials = {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": "", "AWS_SESSION_TOKEN": "",
                      "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none"),
                      "AWS_EC2_METADATA_DISABLED": "true", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AWS_", "FSSPEC_S3"))}
    env.update({key: value for key, value in no_credentials.items() if value})
    done = subprocess.run([sys.executable, "-m", "specbatch.cli", "status", "s3://bucket/jobs/j"], capture_output=True,
                          text=True, cwd=tmp_path, timeout=120, env={**env, "COLUMNS": "200"})
    assert "s3://bucket/jobs/j" in _one_error_line(done)


def test_a_changed_column_map_on_resume_is_refused(tmp_path, tiny_pair):
    from specbatch.job.prepare import prepare

    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "hi", "question": "why"}])
    target, draft, _ = tiny_pair
    config = load_config(None, [f"models.target={target}", f"models.draft={draft}"])
    prepare(data, tmp_path / "j", config, column_map={"prompt": "text"})
    prepare(data, tmp_path / "j", config)  # a resume need not repeat --column
    with pytest.raises(JobError, match="differs from job j's"):
        prepare(data, tmp_path / "j", config, column_map={"prompt": "question"})


@pytest.mark.slow  # one submit that boots Prefect's local server (~20 s on 2 cores)
def test_sigterm_during_ingest_exits_130(tmp_path, tiny_pair):
    data = write_jsonl(tmp_path / "d.jsonl", [{"id": f"p{i}", "prompt": "hi", "max_new_tokens": 2} for i in range(3)])
    config = write_config(tmp_path, tiny_pair)
    done = _cli("submit", str(data), "--config", str(config), "--job-id", "t", "--output", str(tmp_path / "out"),
                cwd=tmp_path, env={"SPECBATCH_CRASH_AT": "ingest_shard:1:TERM"}, timeout=300)
    assert done.returncode == 130 and "Traceback" not in done.stderr, done.stdout + done.stderr
    assert json.loads((tmp_path / "out" / "t" / "manifest.json").read_text())["status"] == "ingesting"


def test_sigterm_before_prefect_starts_exits_130_with_a_message(tmp_path):
    """A SIGTERM in a submit's first seconds (its config, inputs and Prefect still loading) is a stop like
    any other: exit 130 with a line saying so, not the shell's 143 in silence. The config is a FIFO, so
    the signal comes while submit is reading it."""
    import signal

    config = tmp_path / "config.yaml"
    os.mkfifo(config)
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    process = subprocess.Popen([sys.executable, "-m", "specbatch.cli", "submit", str(data), "--config", str(config),
                                "--output", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env={**os.environ, "COLUMNS": "200"})
    try:
        with open(config, "w"):  # returns once submit has opened the config: it waits for the YAML now
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)
    finally:
        process.kill()
        _, stderr = process.communicate()
    assert process.returncode == 130, stderr
    assert stderr.strip().splitlines() == ["interrupted before the job started; nothing was run"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["calibrate", "no-such-job"], "error: no job directory at no-such-job"),  # was "0 committed rounds"
    (["simulate", "--requests", "0"], "error: --requests must be at least 1, got 0"),  # was a failed report
])
def test_lab_commands_refuse_what_has_nothing_to_work_on(tmp_path, args, message):
    assert _one_error_line(_cli(*args, cwd=tmp_path)) == message
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(("args", "option"), [
    (["--prompts", "0"], "--prompts"),  # was a traceback: max() of no prompts
    (["--max-new-tokens", "0"], "--max-new-tokens"),  # was transformers' traceback from hf-generate
    (["--job-prompts", "0"], "--job-prompts"),
])
def test_bench_refuses_a_count_below_one_naming_the_option(tmp_path, args, option):
    done = _cli("bench", "--batch-size", "1", *args, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr and option in done.stderr, done.stderr


@pytest.mark.parametrize("where", ["missing/x.json", "."])
def test_bench_refuses_a_json_path_it_cannot_write_before_it_runs(tmp_path, where):
    # a missing folder was a traceback after every run of the bench, its results lost
    done = _cli("bench", "--prompts", "1", "--batch-size", "1", "--json", where, cwd=tmp_path)
    assert _one_error_line(done).startswith(f"error: --json: cannot write {where}")


def test_a_quoted_home_in_the_dataset_and_output_is_the_home_folder(tmp_path, tiny_pair):
    """`--output '~/jobs'` (the shell leaves a quoted `~`) wrote the job under ./~ while the Parquet
    readers, expanding it, read the home folder: exit 1 on the job's first shard."""
    home, work = tmp_path / "home", tmp_path / "work"
    work.mkdir()
    home.mkdir()
    write_jsonl(home / "d.jsonl", [{"id": f"r{i}", "prompt": f"hello {i}", "max_new_tokens": 3} for i in range(3)])
    config = str(write_config(tmp_path, tiny_pair))
    done = _cli("submit", "~/d.jsonl", "--config", config, "--job-id", "j", "--output", "~/jobs", cwd=work,
                env={"HOME": str(home)}, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (home / "jobs" / "j" / "results.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["request_id"] for line in lines) == ["r0", "r1", "r2"]
    assert not (work / "~").exists()
