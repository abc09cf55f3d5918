"""Issue 44's probe of `measure.sync: window` against `step` on a GPU, for run.sh's
`window_probe` step: the window-sync test's trial (ResNet-18, 32 px, batch 8, bf16, one rank in
this process) with host batches (a DataLoader, pinned) and with the resident batch, three
alternating rounds of each sync mode, at 50 and at 200 measured steps. On the lent H200
(2026-11-27) host batches gave window 78.4-84.6 steps/s against step 84.7-96.6 in the test: is
it the run-ahead with host batches, or window sync itself? One JSON line per trial on stdout.

    python3 docs/results/2026-11-27_h100_ray/window_probe.py
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from raybench.context import WorkerContext
from raybench.grid import expand
from raybench.spec import load_sweep
from raybench.rank.loop import measure_rank

SWEEP = """name: window_probe
system: {label: probe, nodes: 1, gpus_per_node: 1}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8,
           synthetic_samples: 256}
hardware: {num_gpus: 1, dataloader_workers: 0, precision: bf16}
measure: {warmup_steps: 1, measure_steps: 50}
"""


def main() -> int:
    path = Path(tempfile.mkdtemp()) / "probe.yaml"
    path.write_text(SWEEP)
    for steps in (50, 200):
        for data in ("synthetic", "synthetic_device"):
            for round_ in range(3):
                for sync in ("step", "window") if round_ % 2 == 0 else ("window", "step"):
                    (trial,) = expand(load_sweep(path, [
                        f"workload.data={data}", f"measure.sync={sync}",
                        f"measure.measure_steps={steps}"]))
                    ctx = WorkerContext.single(trial.hardware, torch.device("cuda", 0))
                    r = measure_rank(trial, ctx)
                    print(json.dumps({
                        "steps": steps, "data": data, "round": round_, "sync": sync,
                        "steps_per_s": len(r.compute_s) / sum(r.windows_s),
                        "step_p50_ms": 1e3 * statistics.median(
                            w + c for w, c in zip(r.wait_s, r.compute_s, strict=True)),
                        "wait_p50_ms": 1e3 * statistics.median(r.wait_s)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
