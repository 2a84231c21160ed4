"""The recipes' checkpoints: a resumed run restores weights, optimizer, schedule and both random
streams, so it continues exactly as the uninterrupted run would."""

from __future__ import annotations

import os
import random
import subprocess
import sys

import pytest
import torch

from specbatch.models.checkpoint import CheckpointError, load_training_state, save_training_state


def _setup(seed: int):
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    return model, optimizer, schedule, random.Random(seed)


def _steps(model, optimizer, schedule, rng, n: int) -> None:
    for _ in range(n):
        x = torch.randn(3, 4) * rng.random()
        loss = model(x).pow(2).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()


def test_a_resumed_run_continues_as_the_uninterrupted_one(tmp_path):
    straight = _setup(0)
    _steps(*straight, 6)
    first = _setup(0)
    _steps(*first, 3)
    model, optimizer, schedule, rng = first
    save_training_state(tmp_path / "state.pt", model.state_dict(), optimizer, schedule, rng, 3, 1.5)
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]  # written whole, no temporary left
    model, optimizer, schedule, rng = _setup(1)  # another process, other seeds
    weights, step, elapsed = load_training_state(tmp_path / "state.pt", optimizer, schedule, rng)
    model.load_state_dict(weights)
    _steps(model, optimizer, schedule, rng, 3)
    assert (step, elapsed) == (3, 1.5)
    resumed, uninterrupted = model.state_dict(), straight[0].state_dict()
    assert all(torch.equal(resumed[name], uninterrupted[name]) for name in uninterrupted)


def test_no_checkpoint_yet(tmp_path):
    _, optimizer, schedule, rng = _setup(0)
    assert load_training_state(tmp_path / "absent.pt", optimizer, schedule, rng) is None


class _Planted:
    """Anything a pickle would construct on load (a real attack runs a command from `__reduce__`)."""

    ran = False

    def __reduce__(self):
        return (_mark_ran, ())


def _mark_ran() -> None:
    _Planted.ran = True


def test_a_planted_checkpoint_runs_no_code(tmp_path):
    _, optimizer, schedule, rng = _setup(0)
    torch.save({"weights": {}, "optimizer": _Planted(), "schedule": {}, "rng": [], "torch_rng": None,
                "step": 0, "elapsed_s": 0.0}, tmp_path / "distill-checkpoint.pt")
    with pytest.raises(CheckpointError, match="distill-checkpoint.pt is not a checkpoint this recipe wrote") as refused:
        load_training_state(tmp_path / "distill-checkpoint.pt", optimizer, schedule, rng)
    assert not _Planted.ran and len(str(refused.value).splitlines()) == 1


@pytest.mark.slow  # loads the bundled target first (~20 s on 2 busy cores); the refusal itself is tested above
def test_a_planted_checkpoint_is_refused_by_the_cli_in_one_line(tmp_path):
    """`specbatch models distill-draft` resuming from a folder with a planted pickle: exit 2, one line."""
    checkpoints = tmp_path / "checkpoints"
    checkpoints.mkdir()
    torch.save({"planted": _Planted()}, checkpoints / "continuations.pt")
    done = subprocess.run([sys.executable, "-m", "specbatch.cli", "models", "distill-draft", "--output",
                           str(tmp_path / "out"), "--checkpoints", str(checkpoints), "--steps", "1"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "400"})
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("Loading weights")]
    assert done.returncode == 2 and len(lines) == 1, done.stdout + done.stderr
    assert lines[0].startswith("error:") and "continuations.pt is not a checkpoint this recipe wrote" in lines[0]
    assert "GLOBAL test_training_state._mark_ran" in lines[0]  # what the planted file asked for
