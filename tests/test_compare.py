"""`python -m raybench.compare`: verdicts from two rows' windows, the exit codes, real runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from raybench import compare
from raybench.report import judge
from tests.conftest import ROOT

rng = np.random.default_rng(7)


def windows(mean: float, n: int, cv_pct: float = 1.0) -> list[float]:
    return list(mean * (1 + cv_pct / 100 * rng.standard_normal(n)))


def test_verdicts_from_windows():
    assert judge.windows_to_decide() == 4  # 3 vs 3: p >= 0.10 whatever the windows say
    slower = judge.decide(windows(100, 8), windows(90, 8))
    assert slower["verdict"] == "slower" and slower["p"] < 0.05
    assert slower["ratio_ci95"][0] < 0.9 < slower["ratio_ci95"][1]
    assert judge.decide(windows(100, 8), windows(110, 8))["verdict"] == "faster"
    same = judge.decide(windows(100, 8, 0.5), windows(100, 8, 0.5))
    assert same["verdict"] == "unchanged"
    # significant but below the practical threshold: not a regression
    small = judge.decide([100.0] * 4 + [100.1] * 4, [99.0] * 4 + [99.1] * 4)
    assert small["p"] < 0.05 and small["verdict"] == "unchanged"
    # three windows a side, where no exact Mann-Whitney test reaches 0.05 (p >= 0.10): Welch's
    # t on the logs decides a 10% drop (inconclusive before issue 63, item 7) ...
    three = judge.decide([100.0, 101.0, 99.0], [90.0, 91.0, 89.5])
    assert three["verdict"] == "slower" and three["test"] == "welch-t on logs"
    # ... the 45% drop from two runs of the default sweep, and a quiet rerun
    drop = judge.decide([86.1, 86.9, 86.8], [47.2, 48.1, 47.5])
    assert drop["verdict"] == "slower" and drop["ratio_ci95"][1] < 0.97
    assert judge.decide([86.1, 86.9, 86.8], [86.5, 86.2, 87.0])["verdict"] == "unchanged"
    # windows too spread to tell: inconclusive, and about how many would decide
    wide = judge.decide([100.0, 110.0, 92.0], [97.0, 88.0, 104.0])
    assert wide["verdict"] == "inconclusive" and wide["windows_needed"] > 3
    # a configuration known to move 8% run to run: a 6% drop is within its noise
    noisy = judge.decide(windows(100, 8, 0.3), windows(94, 8, 0.3), spread_pct=8.0)
    assert noisy["verdict"] == "unchanged" and noisy["threshold"] == "run-to-run spread"


def test_many_configurations_at_once_get_the_verdicts_each_gets_alone():
    pairs = [(windows(100, n), windows(100 * r, m)) for n, m, r in
             [(5, 5, 0.9), (3, 3, 1.0), (8, 6, 1.1), (5, 5, 1.0), (1, 3, 0.5), (3, 3, 0.7)] * 3]
    many, alone = judge.decide_many(pairs), [judge.decide(b, n) for b, n in pairs]
    for m, a in zip(many, alone, strict=True):  # equal to the last bits of a sum's order
        assert {k: v for k, v in m.items() if k != "ratio_ci95"} == {
            k: v for k, v in a.items() if k != "ratio_ci95"}
        assert [x if x is None else pytest.approx(x, rel=1e-12) for x in a["ratio_ci95"]] \
            == m["ratio_ci95"]
    assert judge.decide([100.0] * 4, [100.0] * 4)["verdict"] == "unchanged"


def test_the_rule_on_simulated_windows_errs_within_its_bounds():
    """Windows of a known ratio, each with a CV of 1-5% (python -m raybench.bench verdicts
    draws more): a rerun called slower at most 5% of the time, a 20% slowdown missed at most
    10% at three windows a side and 1% at five and ten (measured over 2,000 draws: at most
    2.1% and 6.5%, 0.2%, 0)."""
    from raybench.bench.verdicts import simulate

    for n in (3, 5, 10):
        for cv in (1.0, 5.0):
            rerun = simulate(n, 1.0, cv, 0.0, 400, judge.THRESHOLD_PCT, seed=n)
            slow = simulate(n, 0.8, cv, 0.0, 400, judge.THRESHOLD_PCT, seed=100 + n)
            assert rerun["slower"] <= 0.05, (n, cv, rerun)
            assert 1 - slow["slower"] <= (0.10 if n == 3 else 0.01), (n, cv, slow)


def run_dir(tmp_path: Path, name: str, rows: list[dict]) -> Path:
    out = tmp_path / name
    out.mkdir()
    pd.DataFrame(rows).to_parquet(out / "results.parquet")
    return out


def row(key: str, w: list[float], gpu: str = "cpu", **kw) -> dict:
    return {"trial_key": key, "stage": "benchmark", "status": "ok", "workload.batch_size": 8,
            "train/samples_per_s": float(np.mean(w)), "train/window_samples_per_s": w,
            "system/fingerprint": f"fp-{gpu}", "system/accelerator": gpu, **kw}


def test_exit_codes_and_bad_input(tmp_path, capsys):
    base = run_dir(tmp_path, "base", [row("a", windows(100, 6)), row("b", windows(50, 6))])
    slow = run_dir(tmp_path, "slow", [row("a", windows(80, 6)), row("b", windows(50, 6))])
    page = tmp_path / "compare.html"
    assert compare.main([str(base), str(slow), "--json", "--html", str(page)]) == 1
    html = page.read_text()
    assert html.startswith("<!DOCTYPE html>") and "slower" in html and "fig-0-ratios" in html
    out = json.loads(capsys.readouterr().out)["raybench_compare"]
    assert [c["verdict"] for c in out["configurations"]][0] == "slower" and out["slower"] == 1
    assert compare.main([str(base), str(base)]) == 0
    assert "slower" not in capsys.readouterr().out.split("\n")[-2]
    other = run_dir(tmp_path, "other", [row("c", windows(100, 6))])
    assert compare.main([str(base), str(other)]) == 2
    assert "no configuration in common" in capsys.readouterr().err
    assert compare.main([str(base), str(tmp_path)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    a100 = run_dir(tmp_path, "a100", [row("a", windows(50, 6), gpu="A100")])
    h100 = run_dir(tmp_path, "h100", [row("a", windows(100, 6), gpu="H100")])
    assert compare.main([str(h100), str(a100)]) == 2  # two systems: only on purpose
    assert "--across-systems" in capsys.readouterr().err
    assert compare.main([str(h100), str(a100), "--across-systems"]) == 1
    quick = run_dir(tmp_path, "quick", [row("a", windows(100, 3), **{"trial/category": "quick"})])
    canon = run_dir(tmp_path, "canon", [row("a", windows(100, 6),
                                            **{"trial/category": "canonical"})])
    assert compare.main([str(canon), str(quick)]) == 2
    assert "--allow-quick" in capsys.readouterr().err
    assert compare.main([str(canon), str(quick), "--allow-quick"]) == 0
    capsys.readouterr()
    spread = run_dir(tmp_path, "spread", [row("a", [100.0, 112.0, 90.0, 101.0]),
                                          row("b", windows(50, 6))])
    assert compare.main([str(base), str(spread)]) == compare.EXIT_UNDECIDED == 4
    err = capsys.readouterr().err
    assert "1 of 2 configurations undecided" in err and "measure.repeats of" in err, err


SWEEP = """
name: compare
system: {label: test-cpu}
workload: {name: resnet, depth: 18, image_size: 32, num_classes: 10, batch_size: 8,
           synthetic_samples: 256}
hardware: {num_gpus: 0, cpu_workers: 1, dataloader_workers: 0}
measure: {warmup_steps: 2, measure_steps: 6, repeats: 6}
"""


def sweep(tmp_path: Path, name: str, busy: bool) -> Path:
    """A real run in this process (the local runner), pinned to core 0; `busy`: two busy loops
    pinned to the same core, which take about two thirds of it (one took half, and on a
    machine already busy, whose other processes share core 0 with the base run too, the
    ratio came out at 0.89: beyond no threshold)."""
    from raybench.bench.command import main as bench_main

    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP)
    out = tmp_path / name
    cores = os.sched_getaffinity(0)
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
             for _ in range(2 if busy else 0)]
    try:
        for loop in loops:
            os.sched_setaffinity(loop.pid, {0})
        os.sched_setaffinity(0, {0})
        assert bench_main(["run", str(path), "--output", str(out)]) == 0
    finally:
        os.sched_setaffinity(0, cores)
        for loop in loops:
            loop.kill()
            loop.wait()
    return out


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="pins the runs to one core")
# a busy process against none: alone, after the parallel part
@pytest.mark.serial
def test_real_runs_slower_is_slower_and_a_rerun_is_not(tmp_path):
    base = sweep(tmp_path, "base", busy=False)
    rerun = sweep(tmp_path, "rerun", busy=False)
    slow = sweep(tmp_path, "slow", busy=True)
    # this VM's own speed drifts 10-20% between runs a minute apart (docs/journal/2026-11.md,
    # issue 45), which the windows of one run cannot see: the threshold says so, and a run
    # sharing its core with a busy loop (about half the speed) is still beyond it
    # (--allow-quick: a run sharing its core may not settle, and then is a quick row)
    cmd = [sys.executable, "-m", "raybench.compare", "--threshold-pct", "20", "--allow-quick"]
    judged = subprocess.run([*cmd, str(base), str(slow), "--json"], cwd=ROOT,
                            capture_output=True, text=True)
    assert judged.returncode == 1, judged.stdout + judged.stderr
    result = json.loads(judged.stdout)["raybench_compare"]["configurations"][0]
    print(json.dumps(result))
    assert result["verdict"] == "slower" and result["ratio"] < 0.8, result
    for attempt in range(2):
        again = subprocess.run([*cmd, str(base), str(rerun)], cwd=ROOT, capture_output=True,
                               text=True)
        print(again.stdout)
        if again.returncode in (0, compare.EXIT_UNDECIDED) or attempt == 1:
            break
        # a machine whose other work changed between the two runs (its own drift is within
        # the threshold): measured once more, the two runs back to back
        base = sweep(tmp_path, "base_again", busy=False)
        rerun = sweep(tmp_path, "rerun_again", busy=False)
    # not slower: unchanged, or windows that cannot tell (exit 4, issue 63, item 7)
    assert again.returncode in (0, compare.EXIT_UNDECIDED), again.stdout + again.stderr
    assert "slower" not in again.stdout.splitlines()[1], again.stdout


def test_history_mode_judges_the_latest_run(tmp_path, capsys):
    from raybench.results.history import History
    from raybench.results.table import ID_COLUMNS

    for run, mean in (("r1", 100.0), ("r2", 101.0), ("r3", 85.0)):
        History(tmp_path, code_version="v").append({
            **dict.fromkeys(ID_COLUMNS), **row("a", windows(mean, 6)), "run_id": run})
    assert compare.main(["--history", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)["raybench_compare"]
    assert out["run_id"] == "r3" and out["configurations"][0]["verdict"] == "slower"
    assert compare.main(["--history", str(tmp_path / "none")]) == 2
    assert "holds no history" in capsys.readouterr().err


def serving_row(key: str, w: list[float], **kw) -> dict:
    """A closed-loop serving row: output tokens/s and its windows, no training figures."""
    return {"trial_key": key, "stage": "benchmark", "status": "ok",
            "serve/output_tokens_per_s": float(np.mean(w)),
            "serve/window_output_tokens_per_s": w, "system/fingerprint": "fp-cpu", **kw}


def test_history_mode_judges_serving_rows_by_their_output_tokens(tmp_path, capsys):
    """compare --history and the report's history page judge a closed-loop serving row by its
    output tokens/s windows, as compare does two runs of them; a Server row (no windows: its
    throughput is its arrival rate) is not judged."""
    from raybench.report import write_history
    from raybench.results.history import History
    from raybench.results.table import ID_COLUMNS

    for run, mean in (("s1", 1000.0), ("s2", 1010.0), ("s3", 800.0)):
        History(tmp_path, code_version="v").append({
            **dict.fromkeys(ID_COLUMNS), **serving_row("users", windows(mean, 8)),
            "run_id": run})
        History(tmp_path, code_version="v").append({
            **dict.fromkeys(ID_COLUMNS), "trial_key": "srv", "stage": "benchmark",
            "status": "ok", "serve/output_tokens_per_s": mean, "server/rate_qps": 5.0,
            "system/fingerprint": "fp-cpu", "run_id": run})
    assert compare.main(["--history", str(tmp_path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)["raybench_compare"]
    (judged,) = out["configurations"]  # the Server row has nothing to judge
    assert judged["trial_key"] == "users" and judged["verdict"] == "slower"
    assert judged["metric"] == "serve/output_tokens_per_s"
    assert judged["new"] == pytest.approx(800.0, rel=0.02)
    assert judged["base"] == pytest.approx(1005.0, rel=0.02)
    page = write_history(tmp_path, tmp_path / "history.html").read_text()
    assert "serve/output_tokens_per_s" in page and "s3" in page


def test_a_configuration_that_moves_between_runs_widens_the_threshold(tmp_path):
    """Runs of `a` at 100, 120 and 90 on this system before (twice their CV: 29.6%): a new run
    15% below the base is within that, though all its windows are below the base's."""
    hist = pd.DataFrame([{"trial_key": "a", "run_id": f"old{i}", "status": "ok",
                          "train/samples_per_s": v, "system/fingerprint": "fp-cpu"}
                         for i, v in enumerate((100.0, 120.0, 90.0))])
    base = pd.DataFrame([row("a", windows(100, 6), run_id="base")])
    new = pd.DataFrame([row("a", windows(85, 6), run_id="new")])
    alone = compare.compare_runs(base, new)[0]
    assert alone["verdict"] == "slower" and alone["threshold"] == "fixed"
    judged = compare.compare_runs(base, new, history=hist)[0]
    assert judged["threshold"] == "run-to-run spread" and judged["verdict"] == "unchanged"
    assert judged["threshold_pct"] == pytest.approx(29.6, abs=0.1) and judged["p"] < 0.05
