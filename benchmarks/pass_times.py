"""The engine's own passes timed alone: the target's and the draft model's native step as a job builds
them (`hf_backend`), decode-shaped (rows × query positions after `--context` positions), µs per pass,
the median of `--passes`, each shape measured `--rounds` times in turn. To compare revisions, run it
from each revision's tree in turn (`PYTHONPATH=TREE`, as `benchmarks/plain_jobs.py` says), alternating.
Several `--contexts` show what attention over the KV adds to a pass (the rest is the weights' GEMMs).

    python benchmarks/pass_times.py [--set models.dtype=bfloat16] [--set models.target=smollm2-135m]
    python benchmarks/pass_times.py --set models.target=smollm2-135m --shapes 32x1 --contexts 16,256,1024 --passes 9
"""

from __future__ import annotations

import argparse
import json
import statistics

from specbatch.config import load_config
from specbatch.engine.build import hf_backend
from specbatch.engine.cost_profile import time_pass
from specbatch.lab.bench import load_models_for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", dest="overrides", action="append", default=[], help="config override key=value")
    parser.add_argument("--shapes", default="1x1,8x1,1x5", help="rows x query positions, comma-separated")
    parser.add_argument("--contexts", default="160", help="positions before the query, comma-separated")
    parser.add_argument("--passes", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shapes = [tuple(int(part) for part in shape.split("x")) for shape in args.shapes.split(",")]
    contexts = [int(context) for context in args.contexts.split(",")]
    config = load_config(None, [*args.overrides, f"scheduler.max_batch_rows={max(rows for rows, _ in shapes)}",
                                "drafter.kind=draft"])
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
            for (rows, query_len), context in ((shape, context) for shape in shapes for context in contexts):
                key = f"{name} {rows}x{query_len}" + (f" after {context}" if len(contexts) > 1 else "")
                role = "draft" if name == "draft" else "target"  # a draft step keeps only its last logits
                timing = time_pass(model, rows, query_len, context, args.passes, role)
                times.setdefault(key, []).append(timing.ms * 1000)
    print(json.dumps({key: round(statistics.median(values), 1) for key, values in times.items()}))


if __name__ == "__main__":
    main()
