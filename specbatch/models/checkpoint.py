"""Resumable training state for the recipes (`train_eagle`, `distill_draft`): weights, optimizer,
learning-rate schedule, both random streams, step and elapsed seconds, written atomically so that a
run killed mid-write resumes from the last whole checkpoint.

Loaded with `torch.load(weights_only=True)`: a checkpoint holds only tensors, numbers, strings and
containers of them (the Python random state as a list), so a planted file cannot run code when a
recipe resumes from its folder."""

from __future__ import annotations

import os
import random
from pathlib import Path

import torch


def save_training_state(path: Path, weights: dict[str, torch.Tensor], optimizer: torch.optim.Optimizer,
                        schedule: torch.optim.lr_scheduler.LRScheduler, rng: random.Random, step: int,
                        elapsed_s: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"weights": weights, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "rng": _rng_to_list(rng.getstate()), "torch_rng": torch.get_rng_state(), "step": step,
             "elapsed_s": elapsed_s}
    temporary = path.with_suffix(".tmp")
    torch.save(state, temporary)
    os.replace(temporary, path)


def load_training_state(path: Path, optimizer: torch.optim.Optimizer, schedule: torch.optim.lr_scheduler.LRScheduler,
                        rng: random.Random) -> tuple[dict[str, torch.Tensor], int, float] | None:
    """Restore optimizer, schedule and random streams from `path`; returns (weights, step, elapsed
    seconds) for the caller to load, or None when there is no checkpoint yet."""
    if not path.exists():
        return None
    state = torch.load(path, weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    schedule.load_state_dict(state["schedule"])
    rng.setstate(_rng_from_list(state["rng"]))
    torch.set_rng_state(state["torch_rng"])
    return state["weights"], state["step"], state["elapsed_s"]


def _rng_to_list(state: tuple) -> list:
    """`random.Random.getstate()` (version, 625 ints, gauss_next) as plain lists."""
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def _rng_from_list(state: list) -> tuple:
    version, internal, gauss_next = state
    return version, tuple(internal), gauss_next
