"""Where a kernel's instructions and stalls go, SASS opcode by opcode: reads
the source page that Nsight Compute prints for a profile taken with the
SourceCounters section,

  ncu --section SourceCounters --section WarpStateStats -o prof BINARY ...
  ncu -i prof.ncu-rep --page source --csv --print-source sass > source.csv

(plain or gzipped), and prints for each kernel in it (the first profile of a
name; ncu repeats the page per launch): the warp instructions executed and
the stall samples by opcode (the opcode without its modifiers, or with them
under --modifiers), the stall reasons over the whole kernel, and with
--windows N the runs of N consecutive instructions that hold at least 1% of
the samples (where in the code the time goes: a loop's copies, products,
elementwise phase). bench/NOTES.md version 43 reads the training kernels so.

Usage: python3 bench/ncu_source.py source.csv[.gz] [--kernel TEXT] [--top 24] [--modifiers] [--windows 64]
"""
import argparse
import collections
import csv
import gzip
import re
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read_kernels(path):
    """[(kernel name, [instruction rows as dicts])], the first page of each name."""
    opener = gzip.open if path.endswith(".gz") else open
    kernels, seen, rows, header = [], set(), None, None
    with opener(path, "rt", newline="") as f:
        for record in csv.reader(f):
            if record and record[0] == "Kernel Name":
                rows = [] if record[1] not in seen else None
                if rows is not None:
                    seen.add(record[1])
                    kernels.append((record[1], rows))
                header = None
            elif record and record[0] == "Address":
                header = record
            elif rows is not None and header and len(record) == len(header):
                rows.append(dict(zip(header, record)))
    return kernels


def opcode(source, modifiers):
    """The instruction's opcode, its predicate (@P0, @!UP1) dropped; without modifiers its base name."""
    op = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]
    return op if modifiers else op.split(".")[0]


def count(row, column):
    return int(row[column] or 0)


def stall_columns(rows):
    return [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]


def print_kernel(name, rows, top, modifiers, window):
    executed, samples = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"], modifiers)
        executed[op] += count(r, EXECUTED)
        samples[op] += count(r, SAMPLES)
    total_executed, total_samples = sum(executed.values()), max(sum(samples.values()), 1)
    print(f"== {name}")
    print(f"{total_executed / 1e6:.1f} M warp instructions, {total_samples} stall samples")
    for op, n in executed.most_common(top):
        print(f"  {op:<22} {n / 1e6:8.2f} M {100 * n / total_executed:5.1f}%   samples {100 * samples[op] / total_samples:5.1f}%")
    reasons = collections.Counter()
    for r in rows:
        for c in stall_columns(rows):
            reasons[c[len("stall_"):]] += count(r, c)
    print("  stalls: " + ", ".join(f"{k} {100 * v / total_samples:.1f}%" for k, v in reasons.most_common(10)))
    if window:
        print(f"  windows of {window} instructions with at least 1% of the samples:")
        for start in range(0, len(rows), window):
            part = rows[start:start + window]
            share = sum(count(r, SAMPLES) for r in part) / total_samples
            if share < 0.01:
                continue
            ops = collections.Counter(opcode(r["Source"], False) for r in part)
            why = collections.Counter()
            for r in part:
                for c in stall_columns(rows):
                    why[c[len("stall_"):]] += count(r, c)
            print(f"  {start:6d}-{start + len(part):<6d} {100 * share:5.1f}%  "
                  + " ".join(f"{k}{v}" for k, v in ops.most_common(6)) + " | "
                  + " ".join(f"{k} {v}" for k, v in why.most_common(3)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="ncu's source page as CSV (.gz allowed)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this text")
    ap.add_argument("--top", type=int, default=24, help="opcodes listed per kernel")
    ap.add_argument("--modifiers", action="store_true", help="keep opcode modifiers (IMAD.WIDE.U32, not IMAD)")
    ap.add_argument("--windows", type=int, default=0, metavar="N", help="also the hot runs of N instructions")
    args = ap.parse_args()
    kernels = [(n, r) for n, r in read_kernels(args.source) if args.kernel in n and r]
    if not kernels:
        sys.exit(f"ncu_source: no kernel with instruction rows matching {args.kernel!r} in {args.source}")
    for name, rows in kernels:
        print_kernel(name, rows, args.top, args.modifiers, args.windows)


if __name__ == "__main__":
    main()
