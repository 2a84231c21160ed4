"""Policy specs (`scheduler.lookahead`, `scheduler.prefill_chunk`): parsed once when the config is
validated, written back as the same strings, checked against scheduler.max_lookahead."""

from __future__ import annotations

from pathlib import Path

import pytest
from sched_engine_helpers import SimLoop, make_row

from specbatch.config import ConfigError, JobConfig, LookaheadSpec, PrefillChunkSpec, config_to_dict, load_config
from specbatch.job.manifest import load_manifest, new_manifest, save_manifest
from specbatch.lab.compare import policy_config
from specbatch.sched.factory import make_lookahead, make_prefill_chunk, make_scheduler
from specbatch.sched.policies import FixedLookahead, FixedPrefillChunk
from specbatch.sched.prefill import DeadlinePrefillChunk

# JobConfig().model_dump(mode="json") as a manifest stored it before specs were parsed, but for
# the scheduler's policies (field order as it was then: lookahead before max_lookahead)
OLD_MANIFEST_CONFIG = {
    "models": {"target": "bundled:target", "draft": "bundled:draft", "tokenizer": None, "dtype": "float32",
               "device": "cpu", "attn_implementation": "sdpa", "trust_remote_code": False, "num_threads": None},
    "drafter": {"kind": "draft", "ngram_max": 3, "ngram_min": 1},
    "scheduler": {"order": "sjf", "lookahead": "slack", "max_lookahead": 8, "prefill_chunk": "fixed:64",
                  "max_batch_rows": 32, "max_round_tokens": 2048, "tpot_slo_ms": 200.0, "cost_model": None},
    "capacity": {"kv_tokens": None, "kv_bytes": None, "admission": "reserve", "max_context": None},
    "buckets": {"batch_rows": [], "query_len": [], "kv_len_multiple": 32},
    "sampling": {"max_new_tokens": 128, "temperature": 0.0, "top_p": 1.0},
    "io": {"shard_size": 256, "group_window": 4096, "part_every_requests": 64, "part_every_s": 30.0},
    "workers": {"num_processes": 1},
    "seed": 0,
}


@pytest.mark.parametrize(("text", "spec"), [("fixed:0", LookaheadSpec("fixed", 0)),
                                            ("fixed:8", LookaheadSpec("fixed", 8)),
                                            ("adaptive", LookaheadSpec("adaptive")),
                                            ("slack", LookaheadSpec("slack"))])
def test_lookahead_round_trips_as_its_string(text, spec):
    config = load_config(None, [f"scheduler.lookahead={text}"])
    assert config.scheduler.lookahead == spec
    dumped = config_to_dict(config)
    assert dumped["scheduler"]["lookahead"] == text
    assert JobConfig.model_validate(dumped) == config


@pytest.mark.parametrize(("text", "spec"), [("fixed:1", PrefillChunkSpec("fixed", 1)),
                                            ("fixed:256", PrefillChunkSpec("fixed", 256)),
                                            ("deadline", PrefillChunkSpec("deadline"))])
def test_prefill_chunk_round_trips_as_its_string(text, spec):
    config = load_config(None, [f"scheduler.prefill_chunk={text}"])
    assert config.scheduler.prefill_chunk == spec
    dumped = config.model_dump(mode="json")
    assert dumped["scheduler"]["prefill_chunk"] == text
    assert JobConfig.model_validate(dumped) == config


def test_default_config_dumps_the_default_strings():
    scheduler = JobConfig().model_dump(mode="json")["scheduler"]
    assert (scheduler["lookahead"], scheduler["prefill_chunk"]) == ("adaptive", "fixed:256")


def test_a_manifest_saved_before_parsed_specs_still_loads(tmp_path: Path):
    dataset = tmp_path / "d.jsonl"
    dataset.write_text('{"prompt": "a"}\n')
    manifest = new_manifest("job-1", dataset, "jsonl", JobConfig())
    manifest.config = OLD_MANIFEST_CONFIG
    save_manifest(tmp_path / "job", manifest)
    config = JobConfig.model_validate(load_manifest(tmp_path / "job").config)  # what a resumed job does
    assert config.scheduler.lookahead == LookaheadSpec("slack")
    assert config.scheduler.prefill_chunk == PrefillChunkSpec("fixed", 64)
    dumped = config_to_dict(config)  # every stored value comes back as stored; fields added since take defaults
    assert {section: {name: dumped[section][name] for name in fields} if isinstance(fields, dict) else dumped[section]
            for section, fields in OLD_MANIFEST_CONFIG.items()} == OLD_MANIFEST_CONFIG


def test_the_cli_flags_and_policy_specs_go_through_the_same_validation():
    # `--lookahead fixed:2 --prefill-chunk deadline` are these overrides
    config = load_config(None, ["scheduler.lookahead=fixed:2", "scheduler.prefill_chunk=deadline"])
    assert (config.scheduler.lookahead, config.scheduler.prefill_chunk) == (LookaheadSpec("fixed", 2),
                                                                            PrefillChunkSpec("deadline"))
    config = policy_config(JobConfig(), "sjf/adaptive/fixed:64")
    assert (config.scheduler.lookahead, config.scheduler.prefill_chunk) == (LookaheadSpec("adaptive"),
                                                                            PrefillChunkSpec("fixed", 64))
    with pytest.raises(ConfigError, match="scheduler.lookahead"):
        policy_config(JobConfig(), "fcfs/fixed:9")


@pytest.mark.parametrize("overrides", [["scheduler.lookahead=fixed:9"],
                                       ["scheduler.lookahead=fixed:4", "scheduler.max_lookahead=2"],
                                       ["scheduler.lookahead=fixed:3", "scheduler.max_lookahead=0"]])
def test_fixed_lookahead_over_max_lookahead_is_an_error_not_a_clamp(overrides):
    with pytest.raises(ConfigError, match=r"scheduler\.lookahead: .*scheduler\.max_lookahead"):
        load_config(None, overrides)


def test_fixed_lookahead_up_to_max_lookahead_is_fine():
    config = load_config(None, ["scheduler.lookahead=fixed:3", "scheduler.max_lookahead=3"])
    assert config.scheduler.lookahead == LookaheadSpec("fixed", 3)


@pytest.mark.parametrize(("field", "value"), [("lookahead", "fixed:x"), ("lookahead", "greedy"),
                                              ("lookahead", "fixed:"), ("lookahead", "fixed:-1"),
                                              ("lookahead", "fixed:17"), ("lookahead", "fixed:4:2"),
                                              ("lookahead", "deadline"), ("lookahead", "4"),
                                              ("prefill_chunk", "fixed:0"), ("prefill_chunk", "fixed:x"),
                                              ("prefill_chunk", "deadline:8"), ("prefill_chunk", "slack")])
def test_bad_specs_name_their_field(field, value):
    with pytest.raises(ConfigError, match=rf"scheduler\.{field}:"):
        load_config(None, [f"scheduler.{field}={value}"])


@pytest.mark.parametrize("lookahead", ["fixed:4", "adaptive"])
def test_no_drafter_runs_any_lookahead_with_no_drafts(lookahead):
    config = load_config(None, ["drafter.kind=none", f"scheduler.lookahead={lookahead}"])
    scheduler = make_scheduler(config, kv_capacity_tokens=10_000, max_context=512)
    assert scheduler.limits.max_lookahead == 0
    assert scheduler.lookahead == FixedLookahead(0) if lookahead == "fixed:4" else scheduler.draft.cost_fit is None
    loop = SimLoop(scheduler)
    for i in range(3):
        loop.add(make_row(f"r{i}", num_prompt=6, max_new=8))
    loop.run()
    assert len(loop.finished) == 3
    assert sum(r.num_proposed for r in loop.engine.recorder.rounds) == 0


def test_factory_string_entry_points_use_the_config_parser():
    assert make_lookahead("fixed:3", 4) == FixedLookahead(3)
    assert make_prefill_chunk("fixed:64") == FixedPrefillChunk(64)
    assert isinstance(make_prefill_chunk("deadline"), DeadlinePrefillChunk)
    with pytest.raises(ValueError, match="fixed:K"):
        make_lookahead("fixed:x", 4)
    with pytest.raises(ValueError, match="max_lookahead"):
        make_lookahead("fixed:9", 4)  # no silent clamp here either


def test_another_target_drops_the_bundled_drafters_unless_named():
    other = load_config(None, ["models.target=/models/llama"])
    assert other.models.draft is None and other.models.eagle is None and other.drafter.kind == "suffix"
    named = load_config(None, ["models.target=/models/llama", "models.draft=/models/small"])
    assert named.models.draft == "/models/small" and named.drafter.kind == "draft"
    chosen = load_config(None, ["models.target=/models/llama", "drafter.kind=ngram"])
    assert chosen.drafter.kind == "ngram"
    bundled = load_config(None, [])
    assert bundled.models.draft == "bundled:draft" and bundled.drafter.kind == "draft"
    assert load_config(None, ["models.target=bundled:target"]).models.eagle == "bundled:eagle"


def test_a_key_given_twice_in_a_config_file_is_refused_naming_it(tmp_path: Path):
    # PyYAML keeps the last of two equal keys: the first `drafter:` section was dropped without a word
    twice = tmp_path / "twice.yaml"
    twice.write_text("drafter:\n  kind: ngram\nscheduler:\n  lookahead: fixed:2\ndrafter:\n  kind: none\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'drafter' \(line 5\)"):
        load_config(twice)
    nested = tmp_path / "nested.yaml"
    nested.write_text("drafter:\n  kind: ngram\n  kind: none\n")
    with pytest.raises(ConfigError, match=r"duplicate key 'kind' \(line 3\)"):
        load_config(nested)
    merged = tmp_path / "merged.yaml"  # a merge key may repeat what it merges; the section's own key wins
    merged.write_text("drafter:\n  <<: {kind: ngram}\n  kind: none\n")
    assert load_config(merged).drafter.kind == "none"


def test_a_config_file_that_is_not_yaml_is_refused_in_one_line(tmp_path: Path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("drafter: [ngram\n")
    with pytest.raises(ConfigError) as raised:
        load_config(broken)
    assert "\n" not in str(raised.value) and "not valid YAML at line 2" in str(raised.value)


@pytest.mark.parametrize(("spec", "field"), [("bogus", "scheduler.order"), ("fcfs/bogus", "scheduler.lookahead")])
def test_a_bad_policy_spec_is_one_line_naming_its_field(spec, field):
    # it was pydantic's report: several lines, with a link to its docs
    with pytest.raises(ConfigError) as raised:
        policy_config(JobConfig(), spec)
    assert "\n" not in str(raised.value) and str(raised.value).startswith(f"policy {spec!r}: {field}: ")
