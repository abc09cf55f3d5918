"""Where a profiled trial's time went, from its torch.profiler trace (`measure.profile_steps`):
per trace, the span, each event category's count and total time (host ops, CUDA runtime calls
such as kernel launches, GPU kernels and copies), the mean kernel launch on the host, and the
host ops that took longest (inclusive times: an op's children count in it too). run.sh's
`vit_inf_ab` step runs it over the traces of the ViT-L tile-256 inference trial, which ran at
0.57 of in-process through Ray on the H200 (2026-11-27): are Ray's host launches slower, or
does the GPU wait for something else? Traces stay on the device machine (they are large);
these lines come back. One JSON line per trace.

    python3 docs/results/2026-11-27_h100_ray/trace_summary.py runs/*/trials/*.trace.json
"""

from __future__ import annotations

import collections
import json
import sys

LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx")


def summary(path: str) -> dict:
    with open(path) as f:
        data = json.load(f)
    events = [e for e in data.get("traceEvents", data if isinstance(data, list) else [])
              if e.get("ph") == "X" and "dur" in e]
    by_cat: dict[str, list[float]] = collections.defaultdict(list)
    ops: collections.Counter[str] = collections.Counter()
    launches = []
    for e in events:
        by_cat[e.get("cat", "?")].append(float(e["dur"]))
        if e.get("cat") == "cpu_op":
            ops[e["name"]] += float(e["dur"])
        if e.get("name") in LAUNCHES:
            launches.append(float(e["dur"]))
    start = min(float(e["ts"]) for e in events)
    end = max(float(e["ts"]) + float(e["dur"]) for e in events)
    return {
        "trace": path, "span_ms": (end - start) / 1e3,
        "by_category_ms": {c: {"count": len(d), "total_ms": round(sum(d) / 1e3, 3)}
                           for c, d in sorted(by_cat.items())},
        "kernel_launches": len(launches),
        "launch_mean_us": round(sum(launches) / len(launches), 2) if launches else None,
        "top_host_ops_ms": {n: round(t / 1e3, 3) for n, t in ops.most_common(8)},
    }


def main(paths: list[str]) -> int:
    if not paths:
        print("trace_summary.py: no trace given (pass the trials' *.trace.json files)",
              file=sys.stderr)
        return 2
    for p in paths:
        print(json.dumps(summary(p)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
