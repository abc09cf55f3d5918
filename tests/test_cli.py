"""The sweep CLI without starting Ray: --dry-run plans, bad input exits 2 and writes nothing; the
entry points' exit."""

from __future__ import annotations

import subprocess
import sys

import pytest

from raybench.sweep.command import main


@pytest.fixture(autouse=True)
def no_cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def test_dry_run_prints_plan_and_runs_nothing(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = str(__import__("tests.conftest").conftest.ROOT / "sweeps" / "local_cpu.yaml")
    assert main([sweep, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 trials" in out
    assert out.count(" fits") == 4
    assert "workers=2 per_worker={'CPU': 1.0}" in out
    assert not (tmp_path / "results").exists()


def test_dry_run_exits_2_when_a_trial_never_fits(capsys, write_sweep):
    code = main([str(write_sweep()), "--dry-run", "--set", "hardware.num_gpus=64"])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out.count("NEVER FITS: needs") == 2
    assert "GPU=64 in all" in captured.out
    assert "2 of 2 trials can never be placed" in captured.err


def test_dry_run_against_a_cluster_that_does_not_answer_exits_2(capsys, write_sweep):
    """--dry-run plans against the cluster of --address: where nothing answers, one paragraph
    and exit 2 (it was a traceback), before anything else."""
    assert main([str(write_sweep()), "--dry-run", "--address", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybench: no Ray cluster answers at 127.0.0.1:1") and "Fix:" in err
    assert "Traceback" not in err and err.count("\n") == 1


def test_invalid_spec_exits_2_with_one_paragraph(capsys, write_sweep, tmp_path):
    out_dir = tmp_path / "out"
    code = main([str(write_sweep()), "--set", "measure.warmup_steps=9", "--output", str(out_dir)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("raybench: invalid sweep: ")
    assert "sweep.yaml: measure=" in err and "Fix:" in err
    assert len(err.strip().splitlines()) == 1
    assert not out_dir.exists()


def test_unwritable_output_exits_2(capsys, write_sweep, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    # (the local runner: with the ray runner an embedded Ray would start beside the check)
    code = main([str(write_sweep()), "--output", str(blocker / "run"), "--runner", "local"])
    assert code == 2
    assert "output.dir" in capsys.readouterr().err


EXIT = ("import atexit, gc, sys\n"
        "if sys.argv[1] == 'triton': import torch._dynamo  # loads triton, as a run in-process does\n"
        "from raybench import cli\n"
        "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
        "cli.exit(3)\n")


def _exit(case: str) -> subprocess.CompletedProcess:
    from tests.conftest import ROOT

    return subprocess.run([sys.executable, "-c", EXIT, case], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_the_entry_points_exit_with_their_code_and_their_objects_frozen():
    # frozen: Python's last collections at exit skip them (1.4 s of a core after a sweep)
    plain = _exit("plain")
    assert plain.returncode == 3 and plain.stdout.strip() == "frozen True", plain
    # not where triton is loaded: its nanobind bindings would print every object left as a leak
    triton = _exit("triton")
    assert triton.returncode == 3 and triton.stdout.strip() == "frozen False", triton
    assert "nanobind" not in triton.stderr, triton.stderr[-2000:]
