"""Shared fixtures: a tiny random target/draft pair with a real tokenizer, saved as local HF
directories so the engine loads them exactly as it loads any user's model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(min(2, torch.get_num_threads()))

CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i * i)\n",
    "Speculative decoding proposes tokens that the target verifies in one pass.",
] * 20


def make_tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<eos>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", pad_token="<pad>")


def llama(vocab: int, hidden: int, layers: int, seed: int, eos: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=256,
                         initializer_range=0.2, eos_token_id=eos, pad_token_id=eos + 1, bos_token_id=None)
    return LlamaForCausalLM(config).eval()


def perturbed_copy(model: torch.nn.Module, scale: float, seed: int) -> torch.nn.Module:
    """A draft that agrees with the target often but not always: target weights plus noise."""
    torch.manual_seed(seed)
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for parameter in copy.parameters():
            parameter.add_(torch.randn_like(parameter) * scale * parameter.std().clamp(min=1e-3))
    return copy


@pytest.fixture(scope="session", autouse=True)
def shared_prefect_home(tmp_path_factory):
    """One temporary-server database for every `specbatch submit` a test starts (a test that checks
    where Prefect's state goes clears it): a fresh one per output directory created Prefect's schema
    anew each time, ~12 s of every CLI job on 2 cores."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECBATCH_PREFECT_HOME", str(tmp_path_factory.mktemp("prefect-home")))
        yield


@pytest.fixture(scope="session", autouse=True)
def cost_profile_cache(tmp_path_factory):
    """Measured pass times (`sched/pass_profile.py`) go to a session folder, not the user's cache:
    each tiny model is timed once per session, and no test reads a profile another run left."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPECBATCH_CACHE_DIR", str(tmp_path_factory.mktemp("specbatch-cache")))
        yield


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: a 2-thread torch on 2 busy cores stalls (threads wait on each
    other), so rounds run up to 10x slower and their times swing by 100x."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def save_pair(root: Path, target: torch.nn.Module, draft: torch.nn.Module, tokenizer: PreTrainedTokenizerFast,
              tokenizer_apart: bool = False) -> tuple[Path, Path, PreTrainedTokenizerFast]:
    """Save the pair as local HF directories root/target and root/draft, each with the tokenizer,
    or with it apart in root/tokenizer (for a vocabulary the tokenizer does not match)."""
    for name, model in (("target", target), ("draft", draft)):
        model.save_pretrained(root / name)
    for name in ("tokenizer",) if tokenizer_apart else ("target", "draft"):
        tokenizer.save_pretrained(root / name)
    return root / "target", root / "draft", tokenizer


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory):
    """(target_dir, draft_dir, tokenizer): Llama target, perturbed-copy draft, shared tokenizer."""
    root = tmp_path_factory.mktemp("tiny_pair")
    tokenizer = make_tokenizer()
    target = llama(len(tokenizer), 64, 2, seed=0, eos=tokenizer.eos_token_id)
    return save_pair(root, target, perturbed_copy(target, 0.3, seed=1), tokenizer)


@pytest.fixture(scope="session")
def tiny_gpt2(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny_gpt2")
    tokenizer = make_tokenizer()
    torch.manual_seed(3)
    config = GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=256,
                        initializer_range=0.2, eos_token_id=tokenizer.eos_token_id,
                        bos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    target = GPT2LMHeadModel(config).eval()
    return save_pair(root, target, perturbed_copy(target, 0.3, seed=4), tokenizer)


@pytest.fixture(scope="session")
def small_vocab_pair(tmp_path_factory):
    """Vocabulary of 6, so the law of the first two tokens can be enumerated exactly."""
    root = tmp_path_factory.mktemp("small_vocab")
    torch.manual_seed(7)
    config = LlamaConfig(vocab_size=6, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                         num_key_value_heads=2, intermediate_size=64, max_position_embeddings=64,
                         initializer_range=0.3, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    return save_pair(root, target, perturbed_copy(target, 0.5, seed=8), make_tokenizer(), tokenizer_apart=True)


@pytest.fixture(scope="session")
def tiny_eagle(tiny_pair, tmp_path_factory):
    """An EAGLE-3 head for tiny_pair's target (public layout), over a reduced, shifted draft vocabulary."""
    from eagle_helpers import make_head

    return make_head(tiny_pair[0], tmp_path_factory.mktemp("tiny_eagle"), (0, 1, 1), draft_vocab=300)


@pytest.fixture(scope="session")
def small_vocab_eagle(small_vocab_pair, tmp_path_factory):
    from eagle_helpers import make_head

    return make_head(small_vocab_pair[0], tmp_path_factory.mktemp("small_vocab_eagle"), (0, 0, 0), train_steps=30)
