"""`specbatch models`: where the bundled demo pair lives, and the recipe that trains it."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, cast

import typer

from specbatch.cli.common import console, fail

commands = typer.Typer(name="models", no_args_is_help=True, help="The bundled demo model pair.")


@commands.command("path")
def models_path(which: Annotated[str, typer.Argument(help="target | draft")]) -> None:
    """Print the directory of the bundled target or draft model."""
    from specbatch.engine.model_paths import ModelLoadError, resolve_model_path

    if which not in ("target", "draft"):
        fail("expected 'target' or 'draft'")
    try:
        typer.echo(str(resolve_model_path(f"bundled:{which}")))
    except ModelLoadError as error:
        fail(str(error))


@commands.command("train-demo")
def train_demo(
    output: Annotated[Path, typer.Option(help="where to write target/, draft/ and the model card")] = Path(
        "specbatch/models/demo"),
    target_steps: Annotated[int | None, typer.Option(help="override the recipe's target steps")] = None,
    draft_steps: Annotated[int | None, typer.Option(help="override the recipe's draft steps")] = None,
    distill_steps: Annotated[int | None, typer.Option(help="override the draft distillation's steps")] = None,
    checkpoints: Annotated[Path, typer.Option(help="the distillation's checkpoints; a run resumes from them")] = Path(
        "outputs/demo-distill-training"),
) -> None:
    """Train the bundled pair from the standard library's code and pydoc topics (the recipe): the
    target, a draft pre-trained on text, then the draft distilled from the target (resumable)."""
    from dataclasses import replace

    from specbatch.models.distill_draft import DistillRecipe, distill_bundled
    from specbatch.models.train_demo import Recipe, write_model_card
    from specbatch.models.train_demo import train_demo as train

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    recipe = Recipe()
    recipe = replace(recipe, target_steps=target_steps or recipe.target_steps,
                     draft_steps=draft_steps or recipe.draft_steps)
    distillation = DistillRecipe()
    with _checkpoint_refusals():
        train(output, recipe)
        card = distill_bundled(output, checkpoints, replace(distillation, steps=distill_steps or distillation.steps))
    write_model_card(output, card)
    console.print(f"trained pair written to {output}")


@commands.command("train-eagle")
def train_eagle(
    output: Annotated[Path, typer.Option(help="where to write the head (public EAGLE-3 layout) and its card")] = Path(
        "specbatch/models/demo/eagle"),
    target: Annotated[str, typer.Option(help="the target: a Hugging Face directory or a configured name")] = (
        "specbatch/models/demo/target"),
    checkpoints: Annotated[Path, typer.Option(help="where checkpoints go; a run resumes from them")] = Path(
        "outputs/eagle-training"),
    data: Annotated[str, typer.Option(help="corpus: text windows (the bundled base target's recipe); instruct: "
                                           "the target's answers to chat requests; auto: instruct for a target "
                                           "with a chat template other than the bundled one")] = "auto",
    steps: Annotated[int | None, typer.Option(help="override the recipe's steps")] = None,
    draft_vocab: Annotated[int | None, typer.Option(help="instruct: override the draft vocabulary size")] = None,
    prompts: Annotated[int | None, typer.Option(help="instruct: override the number of train prompts")] = None,
) -> None:
    """Train (or resume) an EAGLE-3 head for a target (the recipe, resumable: rerun the same command)."""
    from specbatch.engine.model_paths import ModelLoadError
    from specbatch.models.train_eagle import DataKind, recipe_for
    from specbatch.models.train_eagle import train_eagle as train

    if data not in ("auto", "corpus", "instruct"):
        fail("--data must be auto, corpus or instruct")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        recipe = recipe_for(target, cast(DataKind, data), steps, draft_vocab, prompts)
    except ModelLoadError as error:
        fail(str(error))
    checkpoints.mkdir(parents=True, exist_ok=True)
    with _checkpoint_refusals():
        card = train(target, output, checkpoints, recipe)
    console.print(f"EAGLE head written to {output}: held-out agreement {card['heldout']}")


@commands.command("distill-draft")
def distill_draft(
    output: Annotated[Path, typer.Option(help="where to write the distilled draft and its card")] = Path(
        "outputs/distilled-draft"),
    target: Annotated[Path, typer.Option(help="the target's directory")] = Path("specbatch/models/demo/target"),
    checkpoints: Annotated[Path, typer.Option(help="where checkpoints go; a run resumes from them")] = Path(
        "outputs/distill-training"),
    init: Annotated[Path | None, typer.Option(help="start from this draft (same shape), e.g. the bundled one")] = None,
    steps: Annotated[int | None, typer.Option(help="override the recipe's steps")] = None,
    hidden: Annotated[int, typer.Option(help="draft hidden size")] = 256,
    layers: Annotated[int, typer.Option(help="draft layers")] = 1,
) -> None:
    """Distill a draft from the target's own next-token distributions (resumable)."""
    from dataclasses import replace

    from specbatch.models.distill_draft import DistillRecipe, distill
    from specbatch.models.train_demo import ModelShape

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    recipe = DistillRecipe()
    recipe = replace(recipe, steps=steps or recipe.steps,
                     draft=ModelShape(hidden, layers, max(1, hidden // 64), 3 * hidden))
    with _checkpoint_refusals():
        card = distill(target, output, checkpoints, recipe, init)
    (output / "card.json").write_text(json.dumps(card, indent=2) + "\n")
    console.print(f"distilled draft written to {output}: held-out greedy {card['greedy']}")


@contextmanager
def _checkpoint_refusals() -> Iterator[None]:
    """A file in the checkpoint folder that is not plain training state: one line, exit 2."""
    from specbatch.models.checkpoint import CheckpointError

    try:
        yield
    except CheckpointError as error:
        fail(str(error))
