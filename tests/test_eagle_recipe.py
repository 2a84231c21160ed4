"""The EAGLE-3 recipe for an instruct target, on a tiny one: answers recorded in one generate pass
hold what a teacher-forced pass computes, and a killed run resumes from its checkpoint (and the
recorded answers) to the head the uninterrupted run trains."""

from __future__ import annotations

import logging
import shutil

import pytest
import torch
from safetensors.torch import load_file
from transformers import LlamaForCausalLM

from specbatch.engine.eagle import load_head
from specbatch.models import eagle_records, instruct_data, train_eagle
from specbatch.models.corpus import Document
from specbatch.models.eagle_chain import target_outputs
from specbatch.models.eagle_records import Generation, generate_records
from specbatch.models.train_eagle import EagleRecipe, InstructData

TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<assistant>{% endif %}")
RECIPE = EagleRecipe(steps=4, batch_size=2, checkpoint_every=2, aux_layers=(0, 1, 1), peak_lr=3e-3,
                     instruct=InstructData(num_prompts=6, num_heldout_prompts=4, max_new_tokens=6,
                                           draft_vocab_size=100, eval_every=2))


class Killed(Exception):
    pass


@pytest.fixture(scope="module")
def chat_target(tiny_pair, tmp_path_factory):
    """tiny_pair's target with a chat template."""
    directory = tmp_path_factory.mktemp("chat_target") / "target"
    shutil.copytree(tiny_pair[0], directory)
    tokenizer = tiny_pair[2]
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(directory)
    tokenizer.chat_template = None
    return directory


@pytest.fixture(autouse=True)
def small_corpus(monkeypatch):
    """A few short documents per domain and split instead of the standard library's (seconds to parse)."""
    def documents(domain, split):
        return [Document(f"{domain}:{split}:{i}", domain, f"def f{i}(a, b):\n    return a + {i} * b\n" if
                         domain == "code" else f"The fox jumps {i} times over the dog.") for i in range(5)]

    monkeypatch.setattr(instruct_data, "documents", documents)


def test_recorded_answers_hold_what_a_teacher_forced_pass_computes(chat_target, tiny_pair):
    target = LlamaForCausalLM.from_pretrained(chat_target).eval()
    prompts = [tiny_pair[2]("def f(a, b):")["input_ids"], tiny_pair[2]("The fox")["input_ids"][:2]]
    records = generate_records(target, prompts, Generation((0, 1, 1), max_new_tokens=5, top_k=4))
    for record, prompt in zip(records, prompts, strict=True):
        n, first = len(record.token_ids), len(prompt)
        assert record.token_ids[:first].tolist() == prompt and first < n <= first + 5
        features, logits = target_outputs(target, (0, 1, 1), record.token_ids[None])
        assert record.features.shape == (n - 1, 3 * 64) and record.top_ids.shape == (n - first, 4)
        torch.testing.assert_close(record.features.float(), features[0, :-1], rtol=1e-2, atol=1e-3)
        greedy = logits[0, first - 1 : -1].argmax(-1)
        assert record.top_ids[:, 0].tolist() == greedy.tolist() == record.token_ids[first:].tolist()


def test_a_killed_run_resumes_to_the_head_the_uninterrupted_run_trains(chat_target, tmp_path, monkeypatch, caplog):
    save = train_eagle.save_training_state

    def save_then_die(path, weights, optimizer, schedule, rng, step, elapsed_s):
        save(path, weights, optimizer, schedule, rng, step, elapsed_s)
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(train_eagle, "save_training_state", save_then_die)
        with pytest.raises(Killed):
            train_eagle.train_eagle(str(chat_target), tmp_path / "head", tmp_path / "ckpt", RECIPE)
    with monkeypatch.context() as patch, caplog.at_level(logging.INFO):
        patch.setattr(eagle_records, "generate_records", None)  # the recorded answers are read, not made again
        card = train_eagle.train_eagle(str(chat_target), tmp_path / "head", tmp_path / "ckpt", RECIPE)
    assert "resumed at step 2" in caplog.text
    train_eagle.train_eagle(str(chat_target), tmp_path / "straight", tmp_path / "straight-ckpt", RECIPE)
    resumed, straight = load_file(tmp_path / "head" / "model.safetensors"), load_file(
        tmp_path / "straight" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[name], straight[name]) for name in straight)
    head = load_head(str(tmp_path / "head"), LlamaForCausalLM.from_pretrained(chat_target))
    assert head.draft_vocab_size == 100 and int(head.t2d.sum()) == 100
    assert set(card["heldout"]) == {"code", "chat", "coverage"}
