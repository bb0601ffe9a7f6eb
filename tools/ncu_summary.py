"""Per-kernel medians of an `ncu --csv --metrics ...` report (stdlib only, for the GPU machine).

Usage: python3 tools/ncu_summary.py ncu-decode.csv [--launches N]   (ncu --csv --print-units base: durations in ns)
Prints one line per kernel name (template arguments and parameters cut), sorted by total duration: launches, total
and median duration (us), and the median of every other metric in the report (ncu's units); with --launches N also
the last N launches one by one (kernel, grid, duration). Exits 1 with a message when the file has no metric rows.
"""
from __future__ import annotations

import csv
import re
import statistics
import sys
from collections import defaultdict


def short_name(name: str) -> str:
    name = re.sub(r"\(anonymous namespace\)::|<?unnamed>::", "", name)  # how ncu spells anonymous namespaces
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(.*$", "", name)  # parameters
    depth, out = 0, []
    for ch in name:  # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return "".join(out).split("::")[-1].strip() or name


def main(path: str, last: int = 0) -> int:
    rows = defaultdict(lambda: defaultdict(list))  # kernel -> metric -> values
    launches = defaultdict(set)
    per_launch = defaultdict(dict)  # launch id -> metric -> value (+ "kernel")
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own log lines are not CSV
    for r in csv.DictReader(lines):
        if "Metric Name" not in r or not r.get("Metric Value"):
            continue
        try:
            value = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        k = short_name(r["Kernel Name"])
        rows[k][r["Metric Name"]].append(value)
        launches[k].add(r["ID"])
        per_launch[int(r["ID"])][r["Metric Name"]] = value
        per_launch[int(r["ID"])]["kernel"] = k
    if not rows:
        print(f"ncu_summary: no metric rows in {path}", file=sys.stderr)
        return 1
    dur = "gpu__time_duration.sum"
    metrics = sorted({m for k in rows for m in rows[k] if m != dur})
    total = {k: sum(rows[k].get(dur, [0.0])) for k in rows}
    print("kernel | launches | total us | median us | " + " | ".join(metrics))
    for k in sorted(rows, key=lambda k: -total[k]):
        med = [statistics.median(rows[k][m]) if rows[k].get(m) else float("nan") for m in metrics]
        d = rows[k].get(dur, [0.0])
        # gpu__time_duration in ns (ncu --print-units base)
        print(f"{k} | {len(launches[k])} | {sum(d) / 1e3:.1f} | {statistics.median(d) / 1e3:.2f} | "
              + " | ".join(f"{v:.4g}" for v in med))
    if last:
        print("launch | kernel | grid | us | " + " | ".join(metrics))
        for i in sorted(per_launch)[-last:]:
            m = per_launch[i]
            print(f"{i} | {m['kernel']} | {m.get('launch__grid_size', 0):.0f} | {m.get(dur, 0) / 1e3:.2f} | "
                  + " | ".join(f"{m.get(x, float('nan')):.4g}" for x in metrics))
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    n = 0
    if len(args) == 3 and args[1] == "--launches" and args[2].isdigit():
        n = int(args[2])
        args = args[:1]
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(args[0], n))
