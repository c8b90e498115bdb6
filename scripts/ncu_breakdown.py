#!/usr/bin/env python3
"""Where a run's GPU time goes, kernel by kernel, from Nsight Compute's raw CSV.

Reads what scripts/gpu_session.sh step 5 writes (ncu --metrics gpu__time_duration.sum --csv
--page raw, plain or gzipped; the run's own output lines before the CSV are skipped) and prints
each kernel's launches, total and mean GPU time, largest first. --from/--to take a range of the
launches (0-based, in issue order), e.g. one step's.

  python3 scripts/ncu_breakdown.py results/gpu/lease2/ncu-gpt2-124m.csv.gz --top 25
"""
import argparse
import collections
import csv
import gzip
import sys


def launches(path):
    """(kernel name, grid, block, GPU time in microseconds) for each profiled launch."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = csv.reader(line for line in f if line.startswith('"'))
        header = next(rows, None)
        if header is None:
            sys.exit(f"ncu_breakdown: {path}: no CSV rows (did ncu profile anything?)")
        units = next(rows)
        try:
            name, grid, block, time = (header.index(k) for k in
                                       ("Kernel Name", "Grid Size", "Block Size",
                                        "gpu__time_duration.sum"))
        except ValueError as e:
            sys.exit(f"ncu_breakdown: {path}: {e} (expected ncu --page raw with "
                     "gpu__time_duration.sum)")
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
        if units[time] not in scale:
            sys.exit(f"ncu_breakdown: {path}: gpu__time_duration.sum in unknown unit "
                     f"'{units[time]}'")
        for r in rows:
            if len(r) > time and r[time]:
                yield r[name], r[grid], r[block], float(r[time].replace(",", "")) * scale[units[time]]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--from", dest="lo", type=int, default=0)
    ap.add_argument("--to", dest="hi", type=int, default=None)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    got = list(launches(a.csv))[a.lo:a.hi]
    total = collections.Counter()
    count = collections.Counter()
    shape = {}
    for name, grid, block, us in got:
        key = name.split("(")[0].replace("void ", "")[:72]
        total[key] += us
        count[key] += 1
        shape.setdefault(key, f"{grid} x {block}")
    whole = sum(total.values())
    print(f"# {len(got)} launches, {whole / 1e3:.2f} ms of GPU time (launches {a.lo} to "
          f"{a.lo + len(got) - 1}; {a.csv})")
    print(f"{'ms':>9} {'share':>6} {'launches':>8} {'mean us':>9}  kernel (first grid x block)")
    for key, us in total.most_common(a.top):
        print(f"{us / 1e3:9.3f} {100 * us / whole:5.1f}% {count[key]:8d} {us / count[key]:9.1f}  "
              f"{key}  {shape[key]}")


if __name__ == "__main__":
    main()
