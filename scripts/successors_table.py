"""Print the figures docs/successors.md gives for the successors' runs of the addition demo:
per run and iteration the dev accuracy, and per digit count the sampled evaluation's columns
(verifier@k, majority, pass@1, pass@k, first sample), the tuned temperatures, the groups and
what the filters dropped. Usage: python scripts/successors_table.py RUN_DIR [RUN_DIR ...]"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pyarrow.parquet as pq


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.1f}"


def main(runs: list[str]) -> None:
    for run in map(Path, runs):
        rows = pq.read_table(run / "metrics.parquet").to_pylist()
        last = max(r["iteration"] for r in rows)
        dev = {r["iteration"]: r for r in rows if r["split"] == "dev" and r["class"] == "all"}
        train = {r["iteration"]: r for r in rows if r["split"] == "train" and r["class"] == "all"}
        events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines() if line.strip()]
        done = [e for e in events if e.get("event") == "run_done" or e.get("event") == "run_end"]
        print(f"## {run.name}: dev accuracy by iteration "
              + ", ".join(f"{n}: {pct(dev[n]['accuracy'])}" for n in sorted(dev)))
        print("   train kept by iteration " + ", ".join(f"{n}: {train[n]['kept']}" for n in sorted(train))
              + "; wall seconds (metrics) " + ", ".join(f"{n}: {train[n]['wall_seconds']:.0f}" for n in sorted(train)))
        if any(t.get("temperature") is not None for t in train.values()):
            print("   tuned temperature " + ", ".join(f"{n}: {train[n]['temperature']}" for n in sorted(train)))
        if any(t.get("groups_all_right") is not None for t in train.values()):
            print("   groups all right / all wrong " + ", ".join(
                f"{n}: {train[n]['groups_all_right']}/{train[n]['groups_all_wrong']}" for n in sorted(train)))
            print("   rejected " + "; ".join(f"{n}: " + ", ".join(f"{c['filter']} {c['examples']} ({c['questions']})"
                                                             for c in train[n]["rejected"] or []) for n in sorted(train)))
        per_class = [r for r in rows if r["split"] == "dev" and r["iteration"] == last and r["class"] != "all"]
        print(f"   iteration {last}, dev accuracy per class: "
              + ", ".join(f"{r['class']}: {pct(r['accuracy'])}" for r in per_class))
        sampled = [r for r in rows if r["split"] == "dev" and r["iteration"] == last and r["pass_k"] is not None]
        if sampled:
            print(f"   iteration {last}, per class: class | greedy | first sample | pass@1 | majority@k | "
                  f"verifier@k | pass@k (k)")
            for r in sampled:
                print(f"   | {r['class']} | {pct(r['accuracy'])} | {pct(r['first_sample'])} | {pct(r['pass_at_1'])} | "
                      f"{pct(r['majority'])} | {pct(r['verifier_at_k'])} | {pct(r['pass_at_k'])} ({r['pass_k']}) |")
        if done:
            print("   ", done[-1])


if __name__ == "__main__":
    main(sys.argv[1:])
