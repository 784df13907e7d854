"""Summarise ``ab.py`` launches: per launch, the median over rounds of raw-loop time / variant time (> 1: the variant
is faster); over launches, the median [lowest–highest] of those medians.

    python benchmarks/reports/step/summarize.py benchmarks/reports/step/runs/mobilenetv2-n2.jsonl
"""
from __future__ import annotations

import json
import statistics
import sys


def launch_ratios(record: dict, key: str = "times") -> dict[str, float]:
    """Median over rounds of raw / variant, for each variant but the raw loop, from one launch's record."""
    raw = record[key]["raw"]
    return {name: statistics.median(r / v for r, v in zip(raw, times))
            for name, times in record[key].items() if name != "raw"}


def main(path: str) -> None:
    records = [json.loads(line.split("AB ", 1)[1]) for line in open(path) if "AB " in line]
    for key in ("times", "cpu"):
        label = f"{records[0]['model']} N={records[0]['size']} {key}"
        recorded = [r for r in records if key in r]  # the earliest launches recorded no CPU times
        if len(recorded) < len(records):
            print(f"{label}: not recorded in {len(records) - len(recorded)} of {len(records)} launches")
        if not recorded:
            continue
        per_launch = [launch_ratios(r, key) for r in recorded]
        for name in per_launch[0]:
            values = [p[name] for p in per_launch]
            shown = " ".join(f"{v:.3f}" for v in values)
            print(f"{label}: raw/{name} {statistics.median(values):.3f} "
                  f"[{min(values):.3f}-{max(values):.3f}] over {len(values)} launches ({shown})")


if __name__ == "__main__":
    main(sys.argv[1])
