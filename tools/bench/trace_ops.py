"""Self time per operator of a Chrome trace written by `memory_ablation --trace`, or of two side by side.

  python3 tools/bench/trace_ops.py A.json [B.json] [--top 30]

An operator's self time is its duration less that of the operators it called (nested events of
the same thread). With two traces (the same variant on 1 and on 2 threads, say) each row shows
both and their ratio: operators whose time does not fall with the second thread are the serial
part of the step. The last line is total=<self seconds of A> [<of B> ratio=<B / A>].
"""

import argparse
import collections
import json


def self_times(path):
    with open(path) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_thread = collections.defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "dur" in e:
            by_thread[e.get("tid")].append((float(e["ts"]), float(e["dur"]), e["name"]))
    totals = collections.Counter()
    counts = collections.Counter()
    for spans in by_thread.values():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []  # [end, name, self]
        for ts, dur, name in spans:
            while stack and stack[-1][0] <= ts:
                end, done, own = stack.pop()
                totals[done] += own
            if stack:
                stack[-1][2] -= dur
            stack.append([ts + dur, name, dur])
            counts[name] += 1
        for end, done, own in stack:
            totals[done] += own
    return totals, counts


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("traces", nargs="+")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if len(args.traces) > 2:
        parser.error("one trace, or two to compare")
    a, calls = self_times(args.traces[0])
    b = self_times(args.traces[1])[0] if len(args.traces) == 2 else None
    order = sorted(set(a) | set(b or {}), key=lambda n: -max(a[n], b[n] if b else 0))
    for name in order[: args.top]:
        row = f"{a[name] / 1e6:9.3f} s {calls[name]:8d}x"
        if b is not None:
            ratio = b[name] / a[name] if a[name] > 0 else float("inf")
            row += f" {b[name] / 1e6:9.3f} s  ratio {ratio:5.2f}"
        print(f"{row}  {name}")
    total_a = sum(a.values()) / 1e6
    if b is None:
        print(f"total={total_a:.3f}")
    else:
        total_b = sum(b.values()) / 1e6
        print(f"total={total_a:.3f} {total_b:.3f} ratio={total_b / total_a:.3f}")


if __name__ == "__main__":
    main()
