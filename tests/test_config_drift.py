"""A resumed job refuses config changes that change outputs (exit 2, listing them) unless --force;
changes that only change speed are taken and recorded in the manifest's `config_history`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from job_helpers import submit, write_config, write_jsonl
from pydantic import BaseModel

from specbatch.config import OUTPUT_FIELDS, SPEED_FIELDS, JobConfig, changes_outputs, load_config
from specbatch.job.inputs import JobError
from specbatch.job.manifest import load_manifest
from specbatch.job.prepare import prepare

RECORDS = [{"id": f"q{i}", "prompt": "def add(a, b):", "max_new_tokens": 3} for i in range(2)]


def _fields(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        kind = info.annotation
        nested = isinstance(kind, type) and issubclass(kind, BaseModel)
        paths += _fields(kind, f"{prefix}{name}.") if nested else [f"{prefix}{name}"]
    return paths


def test_every_config_field_is_classified_once():
    fields = _fields(JobConfig)
    assert "sampling.temperature" in fields and "seed" in fields
    for path in fields:
        changes_outputs(path)  # KeyError names a field nobody classified
    assert not OUTPUT_FIELDS & SPEED_FIELDS
    known = set(fields) | {path.split(".")[0] for path in fields}
    assert known >= OUTPUT_FIELDS | SPEED_FIELDS  # no stale key
    assert changes_outputs("sampling.some_future_field") and not changes_outputs("drafter.kind")


def _prepared(tmp_path: Path, tiny_pair, *overrides: str) -> tuple[Path, Path, list[str]]:
    target, draft, _ = tiny_pair
    dataset = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    base = [f"models.target={target}", f"models.draft={draft}", *overrides]
    prepare(dataset, tmp_path / "j", load_config(None, base))
    return dataset, tmp_path / "j", base


def test_output_changes_are_refused_and_listed_unless_forced(tmp_path, tiny_pair):
    dataset, job_dir, base = _prepared(tmp_path, tiny_pair)
    changed = load_config(None, [*base, "sampling.temperature=0.7", "seed=3", "capacity.max_context=64"])
    with pytest.raises(JobError) as refused:
        prepare(dataset, job_dir, changed)
    message = str(refused.value)
    for line in ("sampling.temperature: 0.0 → 0.7", "seed: 0 → 3", "capacity.max_context: None → 64", "--force"):
        assert line in message
    assert load_manifest(job_dir).config["seed"] == 0  # nothing taken
    prepare(dataset, job_dir, changed, force=True)
    manifest = load_manifest(job_dir)
    assert manifest.config["seed"] == 3
    assert manifest.config_history[-1]["forced"] is True
    assert manifest.config_history[-1]["changed"]["seed"] == [0, 3]


def test_a_forced_resume_over_a_changed_dataset_says_what_it_runs(tmp_path, tiny_pair):
    dataset, job_dir, base = _prepared(tmp_path, tiny_pair)
    write_jsonl(dataset, [*RECORDS, {"id": "added", "prompt": "x", "max_new_tokens": 3}])
    with pytest.raises(JobError, match="changed since"):
        prepare(dataset, job_dir, load_config(None, base))
    notices: list[str] = []
    manifest = prepare(dataset, job_dir, load_config(None, base), force=True, notice=notices.append)
    assert manifest.dataset.num_records == 2  # the shards cut before the change
    assert len(notices) == 1 and "the 2 records read then" in notices[0] and "not run" in notices[0]


def test_a_saved_dataset_dicts_unread_splits_are_named_on_the_terminal(tmp_path, tiny_pair):
    """A DatasetDict runs its train split: validation and test were left out in silence."""
    datasets = pytest.importorskip("datasets")
    target, draft, _ = tiny_pair
    splits = {name: datasets.Dataset.from_dict({"prompt": [f"def {name}():"]}) for name in ("train", "test", "val")}
    datasets.DatasetDict(splits).save_to_disk(str(tmp_path / "dd"))
    notices: list[str] = []
    config = load_config(None, [f"models.target={target}", f"models.draft={draft}"])
    manifest = prepare(tmp_path / "dd", tmp_path / "job", config, notice=notices.append)
    assert manifest.dataset.num_records == 1
    assert len(notices) == 1 and "holds splits train, test, val: the job reads train only" in notices[0]
    prepare(tmp_path / "dd", tmp_path / "job", config, notice=notices.append)  # a resume: said once, at ingest
    assert len(notices) == 1


def test_speed_changes_are_taken_and_recorded(tmp_path, tiny_pair):
    dataset, job_dir, base = _prepared(tmp_path, tiny_pair)
    prepare(dataset, job_dir, load_config(None, base))
    assert load_manifest(job_dir).config_history == []  # no change, nothing recorded
    faster = [*base, "scheduler.max_batch_rows=3", "drafter.kind=ngram", "workers.num_processes=2",
              "capacity.kv_tokens=4096", "io.part_every_requests=7", "models.num_threads=1"]
    prepare(dataset, job_dir, load_config(None, faster))
    entry = load_manifest(job_dir).config_history[-1]
    assert entry["forced"] is False and entry["changed"]["scheduler.max_batch_rows"] == [32, 3]
    assert set(entry["changed"]) == {"scheduler.max_batch_rows", "drafter.kind", "workers.num_processes",
                                     "capacity.kv_tokens", "io.part_every_requests", "models.num_threads"}


def test_a_new_draft_may_not_shorten_the_context(tmp_path, tiny_pair):
    dataset, job_dir, base = _prepared(tmp_path, tiny_pair)
    draft = tiny_pair[1]
    for name, positions in (("same", 256), ("short", 64)):
        shutil.copytree(draft, tmp_path / name)
        config = json.loads((tmp_path / name / "config.json").read_text())
        (tmp_path / name / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}))
    prepare(dataset, job_dir, load_config(None, [*base, f"models.draft={tmp_path / 'same'}"]))  # a speed change
    with pytest.raises(JobError, match="models.draft"):
        prepare(dataset, job_dir, load_config(None, [*base, f"models.draft={tmp_path / 'short'}"]))


@pytest.mark.slow  # a whole job through the CLI; the logic is tested without one above
def test_submit_exits_2_on_drift_and_names_the_change(tmp_path, tiny_pair):
    dataset = write_jsonl(tmp_path / "data.jsonl", RECORDS)
    config = write_config(tmp_path, tiny_pair)
    assert submit(dataset, config, "j", tmp_path).returncode == 0
    refused = submit(dataset, config, "j", tmp_path, "--set", "sampling.top_p=0.5", "--lookahead", "fixed:2")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "sampling.top_p: 1.0 → 0.5" in refused.stderr and "lookahead" not in refused.stderr.split("--force")[0]
    assert "Traceback" not in refused.stderr
