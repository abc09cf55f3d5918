"""The in-process path must work where Ray is not installed (a lent GPU machine)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import ROOT


def test_bench_runs_without_ray(tmp_path):
    code = (
        "import sys; sys.modules['ray'] = None\n"  # any `import ray` now raises ImportError
        "from raybench.bench.command import main\n"
        f"sys.exit(main(['run', 'sweeps/local_cpu.yaml', '--trials', '0', '--jsonl', '--output', "
        f"r'{tmp_path}', '--set', 'measure.measure_steps=2', '--set', 'measure.warmup_steps=1', '--set', "
        f"'measure.repeats=1']))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert '"ok": 1' in lines[-1]
    (trial,) = [json.loads(x)["raybench_trial"] for x in lines if x.startswith('{"raybench_trial"')]
    assert trial["status"] == "ok" and trial["samples_per_s"] > 0
    assert trial["total_samples"] == 2 * 8  # 2 measured steps of batch 8 (the grid's first)
    assert trial["config"]["workload.batch_size"] == 8 and trial["elapsed_seconds"] > 0
    assert (tmp_path / "results.parquet").exists()
