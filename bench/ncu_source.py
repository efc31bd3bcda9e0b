"""Where a kernel's instructions and stalls go, SASS opcode by opcode: reads
the source page that Nsight Compute prints for a profile taken with the
SourceCounters section,

  ncu --section SourceCounters --section WarpStateStats -o prof BINARY ...
  ncu -i prof.ncu-rep --page source --csv --print-source sass > source.csv

(plain or gzipped), and prints for each kernel in it (the first profile of a
name; ncu repeats the page per launch): the warp instructions executed and
the stall samples by opcode (the opcode without its modifiers, or with them
under --modifiers), the stall reasons over the whole kernel, and with
--windows N each block of N consecutive instructions (in address order, from
the kernel's first) that holds at least 1% of the samples: where in the code
the time goes, a loop's copies, products, elementwise phase. bench/NOTES.md
version 43 reads the training kernels so.

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
    with open(path, "rb") as f:
        zipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if zipped else open
    kernels, seen, rows, header = [], set(), None, None
    with opener(path, "rt", newline="") as f:
        for record in csv.reader(f):
            if len(record) > 1 and record[0] == "Kernel Name":
                rows = [] if record[1] not in seen else None
                if rows is not None:
                    seen.add(record[1])
                    kernels.append((record[1], rows))
                header = None
            elif record and record[0] == "Address":
                missing = [c for c in ("Source", EXECUTED, SAMPLES) if c not in record]
                if missing:
                    sys.exit(f"ncu_source: {path} has no column {missing[0]!r}: take the page with "
                             "--section SourceCounters (see this file's docstring)")
                header = record
            elif rows is not None and header and len(record) == len(header):
                rows.append(dict(zip(header, record)))
    return kernels


def opcode(source, modifiers):
    """The instruction's opcode, its predicate (@P0, @!UP1) dropped; without modifiers its base name."""
    op = re.sub(r"^@!?U?P\w+\s+", "", source.strip()).split(" ")[0]
    return op if modifiers else op.split(".")[0]


def count(row, column):
    """A counter's value ('1,234' as ncu may print it; '' or '-' as 0)."""
    value = row[column].replace(",", "")
    return int(value) if value.isdigit() else 0


def stalls(rows, columns):
    """Stall samples of the rows by reason (the column without its stall_ prefix)."""
    total = collections.Counter()
    for r in rows:
        for c in columns:
            total[c[len("stall_"):]] += count(r, c)
    return total


def print_kernel(name, rows, top, modifiers, window):
    columns = [c for c in rows[0] if c.startswith("stall_") and "Not Issued" not in c]
    executed, samples = collections.Counter(), collections.Counter()
    for r in rows:
        op = opcode(r["Source"], modifiers)
        executed[op] += count(r, EXECUTED)
        samples[op] += count(r, SAMPLES)
    total_executed, total_samples = max(sum(executed.values()), 1), max(sum(samples.values()), 1)
    print(f"== {name}")
    print(f"{sum(executed.values()) / 1e6:.1f} M warp instructions, {sum(samples.values())} stall samples")
    for op, n in executed.most_common(top):
        share, sampled = 100 * n / total_executed, 100 * samples[op] / total_samples
        print(f"  {op:<22} {n / 1e6:8.2f} M {share:5.1f}%   samples {sampled:5.1f}%")
    if columns:
        print("  stalls: " + ", ".join(f"{k} {100 * v / total_samples:.1f}%"
                                       for k, v in stalls(rows, columns).most_common(10)))
    if window:
        print(f"  blocks of {window} instructions with at least 1% of the samples:")
        for start in range(0, len(rows), window):
            part = rows[start:start + window]
            share = sum(count(r, SAMPLES) for r in part) / total_samples
            if share < 0.01:
                continue
            ops = collections.Counter(opcode(r["Source"], False) for r in part)
            print(f"  {start:6d}-{start + len(part):<6d} {100 * share:5.1f}%  "
                  + " ".join(f"{k}{v}" for k, v in ops.most_common(6)) + " | "
                  + " ".join(f"{k} {v}" for k, v in stalls(part, columns).most_common(3)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="ncu's source page as CSV (.gz allowed)")
    ap.add_argument("--kernel", default="", help="only kernels whose name contains this text")
    ap.add_argument("--top", type=int, default=24, help="opcodes listed per kernel")
    ap.add_argument("--modifiers", action="store_true", help="keep opcode modifiers (IMAD.WIDE.U32, not IMAD)")
    ap.add_argument("--windows", type=int, default=0, metavar="N", help="also the hot blocks of N instructions")
    args = ap.parse_args()
    kernels = [(n, r) for n, r in read_kernels(args.source) if args.kernel in n and r]
    if not kernels:
        sys.exit(f"ncu_source: no kernel with instruction rows matching {args.kernel!r} in {args.source}")
    for name, rows in kernels:
        print_kernel(name, rows, args.top, args.modifiers, args.windows)


if __name__ == "__main__":
    main()
