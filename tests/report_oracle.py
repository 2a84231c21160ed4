"""The oracle: each report figure computed by hand, in plain Python, from a job's Parquet rows.

The expected values come only from the committed rows on disk (`rows(job_dir, table)`, read with
pyarrow), never from the SQL under test nor from how the jobs were built.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from specbatch import ledger


def rows(job_dir: Path, table: str) -> list[dict]:
    """Committed rows of one table, with the job_id, part and run_id the views derive."""
    out = []
    for part in ledger.committed_parts(job_dir):
        run_id = ledger.parse_part_name(part)[1]
        for row in pq.read_table(job_dir / table / f"{part}.parquet").to_pylist():
            out.append({"job_id": job_dir.name, "part": part, "run_id": run_id, **row})
    return out


PER_1K_COLUMNS = ("num_target_passes", "num_target_rows", "num_draft_passes", "num_draft_rows",
                  "num_padded_target_rows", "num_padded_draft_rows", "num_kv_tokens_read")
SUMMED_ROUND_COLUMNS = ("num_committed", *PER_1K_COLUMNS, "num_proposed", "num_accepted", "kv_tokens_in_use",
                        "kv_tokens_capacity")


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    return None if numerator is None or not denominator else numerator / denominator


def _union_length(spans: list[tuple[float, float]]) -> float:
    total, current = 0.0, None
    for start, end in sorted(spans):
        if current is None or start > current[1]:
            total += current[1] - current[0] if current else 0.0
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (current[1] - current[0] if current else 0.0)


def wall_s(job_dir: Path) -> float:
    spans: dict[tuple, list[float]] = {}
    for r in rows(job_dir, "rounds"):
        start, end = r["started_s"], r["started_s"] + r["round_ms"] / 1000.0
        key = (r["run_id"], r["worker_id"])
        old = spans.get(key, [start, end])
        spans[key] = [min(old[0], start), max(old[1], end)]
    return _union_length([tuple(s) for s in spans.values()])


def expected_throughput(jobs: list[Path], baseline: str | None = None) -> list[dict]:
    out = []
    for job in jobs:
        rounds, results = rows(job, "rounds"), rows(job, "results")
        total = {c: sum(r[c] for r in rounds) for c in SUMMED_ROUND_COLUMNS}
        device_s = sum(r["round_ms"] for r in rounds) / 1000.0
        per_1k = {f"{c[4:] if c.startswith('num_') else c}_per_1k": _ratio(1000.0 * total[c], total["num_committed"])
                  for c in PER_1K_COLUMNS}
        out.append({
            "job_id": job.name,
            "num_records": len(results),
            **{f"num_{s}": sum(r["status"] == s for r in results) for s in ("completed", "dropped", "cancelled")},
            "num_rounds": len(rounds),
            "num_committed": total["num_committed"],
            "wall_s": wall_s(job),
            "device_s": device_s,
            "committed_tokens_per_s": _ratio(total["num_committed"], wall_s(job)),
            **per_1k,
            "device_s_per_1k": _ratio(1000.0 * device_s, total["num_committed"]),
            "committed_per_target_pass": _ratio(total["num_committed"], total["num_target_passes"]),
            "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
            "kv_occupancy": _ratio(total["kv_tokens_in_use"], total["kv_tokens_capacity"]),
        })
    base = next(r for r in out if r["job_id"] == (baseline or min(r["job_id"] for r in out)))
    for row in out:
        row["baseline_job"] = base["job_id"]
        row["speedup"] = _ratio(row["committed_tokens_per_s"], base["committed_tokens_per_s"])
        row["device_cost_ratio"] = _ratio(row["device_s_per_1k"], base["device_s_per_1k"])
        row["target_pass_ratio"] = _ratio(row["target_passes_per_1k"], base["target_passes_per_1k"])
    return out


def latency_samples(job: Path) -> dict[str, list[float]]:
    """The per-request and per-emission latencies, as the views define them, in plain Python."""
    done = {r["request_id"]: r for r in rows(job, "requests") if r["status"] == "completed"}
    samples: dict[str, list[float]] = defaultdict(list)
    for r in done.values():
        if r["admitted_s"] is not None:
            samples["queue_s"].append(r["admitted_s"] - r["arrival_s"])
        if r["first_token_s"] is not None:
            samples["ttft_s"].append(r["first_token_s"] - r["arrival_s"])
            if r["num_output_tokens"] > 1:
                samples["tpot_s"].append((r["finished_s"] - r["first_token_s"]) / (r["num_output_tokens"] - 1))
        samples["completion_s"].append(r["finished_s"] - r["arrival_s"])
    emissions: dict[str, list[dict]] = defaultdict(list)
    for s in rows(job, "steps"):
        request = done.get(s["request_id"])
        if request is not None and s["run_id"] == request["run_id"] and s["num_committed"] > 0:
            emissions[s["request_id"]].append(s)
    for steps in emissions.values():
        steps.sort(key=lambda s: (s["emitted_s"], s["round_index"]))
        for i, step in enumerate(steps):
            gap = step["emitted_s"] - steps[i - 1]["emitted_s"] if i else None
            if gap is not None:
                samples["gap_per_emission_s"].append(gap)
                samples["gap_per_token_s"].append(gap)
            samples["gap_per_token_s"] += [0.0] * (step["num_committed"] - 1)
    return samples


def expected_latency(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        statuses = [r["status"] for r in rows(job, "results")]
        samples = latency_samples(job)
        for metric in ("queue_s", "ttft_s", "gap_per_emission_s", "gap_per_token_s", "tpot_s", "completion_s"):
            values = np.array(samples.get(metric, []))
            stats = (
                dict(zip(("p50_s", "p90_s", "p99_s"), np.percentile(values, [50, 90, 99]), strict=True))
                if len(values)
                else dict.fromkeys(("p50_s", "p90_s", "p99_s"))
            )
            out.append({
                "job_id": job.name,
                "metric": metric,
                "num_samples": len(values),
                **stats,
                "mean_s": values.mean() if len(values) else None,
                "max_s": values.max() if len(values) else None,
                "num_included": statuses.count("completed"),
                "num_left_out": len(statuses) - statuses.count("completed"),
                "num_dropped_left_out": statuses.count("dropped"),
                "num_cancelled_left_out": statuses.count("cancelled"),
            })
    return out


def _group(items: list[dict], key) -> dict:
    groups: dict = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(sorted(groups.items()))


def expected_by_domain(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        for domain, rs in _group(rows(job, "requests"), lambda r: r["domain"]).items():
            columns = ("num_output_tokens", "num_proposed", "num_accepted", "num_rounds")
            total = {c: sum(r[c] for r in rs) for c in columns}
            out.append({
                "job_id": job.name,
                "domain": domain,
                "num_requests": len(rs),
                "num_completed": sum(r["status"] == "completed" for r in rs),
                "num_output_tokens": total["num_output_tokens"],
                "num_proposed": total["num_proposed"],
                "num_accepted": total["num_accepted"],
                "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                "output_tokens_per_round": _ratio(total["num_output_tokens"], total["num_rounds"]),
            })
    return out


def expected_by_position(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        steps = rows(job, "steps")
        for j in range(1, max((s["num_proposed"] for s in steps), default=0) + 1):
            proposed = [s for s in steps if s["num_proposed"] >= j]
            accepted = sum(s["num_accepted"] >= j for s in proposed)
            survived = sum(s["num_accepted"] >= j - 1 for s in proposed)
            out.append({
                "job_id": job.name,
                "position": j,
                "num_proposed": len(proposed),
                "num_accepted": accepted,
                "acceptance_rate": accepted / len(proposed),
                "conditional_rate": _ratio(accepted, survived),
            })
    return out


def expected_by_k(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        for k, ss in _group(rows(job, "steps"), lambda s: s["k"]).items():
            total = {c: sum(s[c] for s in ss) for c in ("num_proposed", "num_accepted", "num_committed")}
            out.append({
                "job_id": job.name,
                "k": k,
                "num_steps": len(ss),
                **total,
                "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                "committed_per_step": total["num_committed"] / len(ss),
            })
    return out


def expected_over_time(jobs: list[Path], num_bins: int = 20) -> list[dict]:
    out = []
    for job in jobs:
        rounds = rows(job, "rounds")
        if not rounds:
            continue
        t0 = min(r["started_s"] for r in rounds)
        bin_s = max(max(r["started_s"] for r in rounds) - t0, 1e-9) / num_bins
        bins = [min(int(np.floor((r["started_s"] - t0) / bin_s)), num_bins - 1) for r in rounds]
        for b, pairs in _group(list(zip(bins, rounds, strict=True)), lambda pair: pair[0]).items():
            rs = [r for _, r in pairs]
            columns = ("num_proposed", "num_accepted", "num_committed", "num_target_passes")
            total = {c: sum(r[c] for r in rs) for c in columns}
            out.append({
                "job_id": job.name,
                "time_bin": b,
                "bin_start_s": b * bin_s,
                "num_rounds": len(rs),
                "num_proposed": total["num_proposed"],
                "num_accepted": total["num_accepted"],
                "num_committed": total["num_committed"],
                "acceptance_rate": _ratio(total["num_accepted"], total["num_proposed"]),
                "committed_per_target_pass": _ratio(total["num_committed"], total["num_target_passes"]),
            })
    return out


def expected_drops(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        results = rows(job, "results")
        failed = [r for r in results if r["status"] != "completed"]
        groups = _group(failed, lambda r: (r["status"], r["drop_reason"] or r["finish_reason"] or "unspecified"))
        for (status, reason), rs in sorted(groups.items(), key=lambda kv: (kv[0][0], -len(kv[1]), kv[0][1])):
            messages = [r["drop_message"] for r in rs if r["drop_message"] is not None]
            out.append({
                "job_id": job.name,
                "status": status,
                "reason": reason,
                "num_requests": len(rs),
                "num_output_tokens": sum(r["num_output_tokens"] for r in rs),
                "share_of_records": len(rs) / len(results),
                "example_message": min(messages) if messages else None,
            })
    return out


def expected_worker_balance(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds, requests = rows(job, "rounds"), rows(job, "requests")
        by_worker = _group(rounds, lambda r: r["worker_id"])
        busy = {w: sum(r["round_ms"] for r in rs) / 1000.0 for w, rs in by_worker.items()}
        committed = {w: sum(r["num_committed"] for r in rs) for w, rs in by_worker.items()}
        end = {w: max(r["started_s"] + r["round_ms"] / 1000.0 for r in rs) for w, rs in by_worker.items()}
        for w in sorted(by_worker):
            mine = [r for r in requests if r["worker_id"] == w]
            out.append({
                "job_id": job.name,
                "worker_id": w,
                "num_requests": len(mine),
                "num_completed": sum(r["status"] == "completed" for r in mine),
                "num_rounds": len(by_worker[w]),
                "num_committed": committed[w],
                "busy_s": busy[w],
                "busy_fraction": _ratio(busy[w], wall_s(job)),
                "busy_vs_mean": busy[w] / (sum(busy.values()) / len(busy)),
                "committed_share": committed[w] / sum(committed.values()),
                "idle_at_end_s": max(end.values()) - end[w],
            })
    return out


def expected_overhead(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds = rows(job, "rounds")
        if not rounds:
            continue
        phases = ("plan", "reuse", "prefill", "draft", "verify", "commit", "warmup")
        total = {c: sum(r[c] or 0 for r in rounds) for c in ("round_ms", *(f"{p}_ms" for p in phases))}
        out.append({
            "job_id": job.name,
            "num_rounds": len(rounds),
            "round_ms": total["round_ms"],
            "plan_ms": total["plan_ms"],
            **{f"{p}_share": total[f"{p}_ms"] / total["round_ms"] for p in phases},
            "other_share": 1 - sum(total[f"{p}_ms"] for p in phases) / total["round_ms"],
            "mean_plan_ms": total["plan_ms"] / len(rounds),
            "p99_plan_ms": np.percentile([r["plan_ms"] for r in rounds], 99),
        })
    return out


def expected_prefix_cache(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        requests = [r for r in rows(job, "requests") if r["status"] != "dropped"]
        rounds = rows(job, "rounds")
        if not requests or not rounds:
            continue
        prompt = sum(r["num_prompt_tokens"] for r in requests)
        reused = sum(r["num_reused_tokens"] for r in requests)
        prefilled = sum(r["num_prefill_tokens"] for r in rounds)
        padded = sum(r["num_padded_prefill_rows"] for r in rounds)
        prefill_ms, reuse_ms = (sum(r[c] for r in rounds) for c in ("prefill_ms", "reuse_ms"))
        out.append({
            "job_id": job.name, "num_requests": len(requests),
            "hit_rate": sum(r["num_reused_tokens"] > 0 for r in requests) / len(requests),
            "num_prompt_tokens": prompt, "num_reused_tokens": reused, "num_prefill_tokens": prefilled,
            "reused_share": reused / prompt, "prefilled_share": prefilled / prompt,
            "prefill_ms_per_token": prefill_ms / prefilled if prefilled else None,
            "reuse_ms_per_token": reuse_ms / reused if reused else None,
            "engine_ms_saved": reused * prefill_ms / prefilled - reuse_ms if prefilled else None,
            "prefill_share": prefill_ms / sum(r["round_ms"] for r in rounds),
            "prefill_padding_share": padded / (prefilled + padded) if prefilled + padded else None,
        })
    return out


def expected_kv_blocks(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds = rows(job, "rounds")
        in_use = [r["kv_blocks_in_use"] or 0 for r in rounds]
        referenced = sum(r["kv_blocks_referenced"] or 0 for r in rounds)
        target = sum(r["num_target_rows"] + r["num_padded_target_rows"] for r in rounds)
        out.append({"job_id": job.name, "num_rounds": len(rounds), "mean_blocks_in_use": sum(in_use) / len(rounds),
                    "peak_blocks_in_use": max(in_use),
                    "mean_blocks_shared": sum(r["kv_blocks_shared"] or 0 for r in rounds) / len(rounds),
                    "mean_blocks_cached": sum(r["kv_blocks_cached"] or 0 for r in rounds) / len(rounds),
                    "num_blocks_evicted": sum(r["kv_blocks_evicted"] or 0 for r in rounds),
                    "sharing_factor": referenced / sum(in_use) if sum(in_use) else None,
                    "padded_share": sum(r["num_padded_target_rows"] for r in rounds) / target if target else None})
    return out


def expected_speculation_limit(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds = [r for r in rows(job, "rounds") if r["num_decode_rows"] > 0 and r["plain_ms"] > 0]
        if not rounds:
            continue
        plain = sum(r["plain_ms"] for r in rounds)
        limit = plain / sum(r["plain_ms"] / r["limit_speedup"] for r in rounds)
        plain_rate = sum(r["num_decode_rows"] for r in rounds) / plain
        planned = sum(r["num_committed"] for r in rounds) / sum(r["predicted_ms"] for r in rounds) / plain_rate
        decode_ms = sum(r["round_ms"] - r["prefill_ms"] - r["reuse_ms"] - r["warmup_ms"] for r in rounds)
        out.append({"job_id": job.name, "num_rounds": len(rounds), "limit_speedup": limit,
                    "planned_speedup": planned,
                    "measured_speedup": sum(r["num_committed"] for r in rounds) / decode_ms / plain_rate,
                    "realised_of_limit": planned / limit})
    return out


def expected_speculation_by_drafter(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds = {(r["run_id"], r["worker_id"], r["round_index"]): r for r in rows(job, "rounds") if r["plain_ms"] > 0}
        steps = [(s, rounds[s["run_id"], s["worker_id"], s["round_index"]]) for s in rows(job, "steps")
                 if (s["run_id"], s["worker_id"], s["round_index"]) in rounds]
        by_drafter = _group(steps, lambda pair: "none" if pair[0]["k"] == 0 else pair[0]["drafter"])
        for drafter, pairs in sorted(by_drafter.items()):
            n = len(pairs)
            accepted = sum(s["num_accepted"] for s, _ in pairs)
            rejections = sum(s["num_accepted"] < s["num_proposed"] for s, _ in pairs)
            ratio = sum(r["predicted_ms"] / r["plain_ms"] for _, r in pairs) / n
            realised = sum(s["num_committed"] for s, _ in pairs) / n / ratio
            limit = sum(r["limit_speedup"] for _, r in pairs) / n
            out.append({"job_id": job.name, "drafter": drafter, "num_steps": n,
                        "num_proposed": sum(s["num_proposed"] for s, _ in pairs),
                        "proposed_share": sum(s["num_proposed"] > 0 for s, _ in pairs) / n,
                        "alpha": _ratio(accepted, accepted + rejections), "realised_speedup": realised,
                        "limit_speedup": limit, "realised_of_limit": realised / limit})
    return out


def expected_structured_output(jobs: list[Path]) -> list[dict]:
    out = []
    for job in jobs:
        rounds = rows(job, "rounds")
        total = {c: sum(r.get(c) or 0 for r in rounds) for c in ("mask_ms", "mask_wait_ms", "round_ms", "num_proposed",
                                                                 "num_committed", "num_forced_proposed",
                                                                 "num_forced_accepted")}
        if total["mask_ms"] <= 0 and total["num_forced_proposed"] <= 0:
            continue
        masked = [r for r in rounds if (r.get("mask_ms") or 0) > 0]
        out.append({"job_id": job.name, "num_masked_rounds": len(masked), "mask_ms": total["mask_ms"],
                    "mask_wait_ms": total["mask_wait_ms"],
                    "overhead_share": _ratio(total["mask_wait_ms"], total["round_ms"]),
                    "mask_to_verify": _ratio(total["mask_ms"], sum(r["verify_ms"] for r in masked)),
                    "num_forced_proposed": total["num_forced_proposed"],
                    "num_forced_accepted": total["num_forced_accepted"],
                    "forced_share_of_proposed": _ratio(total["num_forced_proposed"], total["num_proposed"]),
                    "forced_share_of_committed": _ratio(total["num_forced_accepted"], total["num_committed"])})
    return out


EXPECTED = {
    "throughput_vs_cost": expected_throughput,
    "latency": expected_latency,
    "drops": expected_drops,
    "acceptance_by_domain": expected_by_domain,
    "acceptance_by_position": expected_by_position,
    "acceptance_by_k": expected_by_k,
    "acceptance_over_time": expected_over_time,
    "worker_balance": expected_worker_balance,
    "scheduler_overhead": expected_overhead,
    "prefix_cache": expected_prefix_cache,
    "kv_blocks": expected_kv_blocks,
    "speculation_limit": expected_speculation_limit,
    "speculation_by_drafter": expected_speculation_by_drafter,
    "structured_output": expected_structured_output,
}
