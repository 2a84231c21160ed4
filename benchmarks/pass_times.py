"""The engine's own passes timed alone: the target's and the draft model's native step as a job builds
them (`hf_backend`), decode-shaped (rows × query positions after `--context` positions), µs per pass,
the median of `--passes`, each shape measured `--rounds` times in turn. To compare revisions, run it
from each revision's tree in turn (`PYTHONPATH=TREE`, as `benchmarks/plain_jobs.py` says), alternating.

    python benchmarks/pass_times.py [--set models.dtype=bfloat16] [--set models.target=smollm2-135m]
"""

from __future__ import annotations

import argparse
import json
import statistics

from specbatch.config import load_config
from specbatch.engine.build import hf_backend
from specbatch.engine.cost_profile import time_pass
from specbatch.lab.bench import load_models_for

SHAPES = ((1, 1), (8, 1), (1, 5))  # (rows, query positions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = load_config(None, [*args.overrides, "scheduler.max_batch_rows=8", "drafter.kind=draft"])
    drafts = config.models.draft is not None
    config = config.model_copy(update={"drafter": config.drafter.model_copy(update={"kind": "draft" if drafts
                                                                                     else "none"})})
    models = load_models_for(config, ["draft" if drafts else "none"])
    backend, _ = hf_backend(config, models)
    steps = {"target": backend.target}
    if drafts:
        steps["draft"] = backend.drafter.draft  # type: ignore[attr-defined]  # a DraftModelDrafter
    times: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, model in steps.items():
            for rows, query_len in SHAPES:
                key = f"{name} {rows}x{query_len}"
                role = "draft" if name == "draft" else "target"  # a draft step keeps only its last logits
                timing = time_pass(model, rows, query_len, args.context, args.passes, role)
                times.setdefault(key, []).append(timing.ms * 1000)
    print(json.dumps({key: round(statistics.median(values), 1) for key, values in times.items()}))


if __name__ == "__main__":
    main()
