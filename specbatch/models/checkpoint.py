"""Resumable training state for the recipes (`train_eagle`, `distill_draft`): weights, optimizer,
learning-rate schedule, both random streams, step and elapsed seconds, written atomically so that a
run killed mid-write resumes from the last whole checkpoint.

Loaded with `torch.load(weights_only=True)`: a checkpoint holds only tensors, numbers, strings and
containers of them (the Python random state as a list), so a planted file cannot run code when a
recipe resumes from its folder."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A file in a checkpoint folder that is not plain training state; the CLI prints it in one line (exit 2)."""


def load_plain(path: Path) -> Any:
    """`torch.load(weights_only=True)` of a file a recipe wrote: tensors, numbers, strings, containers.
    Anything else (a pickle that would construct objects or run code) is refused with one line
    naming the file, not torch's multi-line explanation."""
    try:
        return torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as error:
        raise CheckpointError(f"{path} is not a checkpoint this recipe wrote ({_reason(error)}); remove it to start "
                              "that step over") from None


def _reason(error: Exception) -> str:
    """The line of torch's message that says what was refused (it names the global a pickle asked for),
    without its advice to load the file unsafely."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    named = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return (named or lines or [type(error).__name__])[0].split(". ")[0].rstrip(".")


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
    state = load_plain(path)
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
