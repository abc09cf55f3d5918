"""Bad input through the real CLI: exit 2, one paragraph naming the file, the key and the fix, and
nothing written to any results or history table (issue: reliability, item 5). Most cases call the
CLI's `main` in this process (a process per case cost 3-5 s of imports each); the cases that need
a process of their own (the exit status a shell sees, a cluster) start one."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import ROOT, TINY_SWEEP
from tests.integration.ray_nodes import free_port

SWEEP = TINY_SWEEP + "output: {root: RESULTS}\n"  # the shared tiny sweep, tables under tmp


def run_cli(tmp_path: Path, text: str | None, *args: str,
            process: bool = False) -> subprocess.CompletedProcess:
    """`python -m raybench.sweep SWEEP ARGS` from the project root, as its own process or as
    the same `main` called here; stdout, stderr and the exit status either way. Called here,
    with the local runner unless ARGS name one: the input is checked before any runner starts,
    and the ray runner would start an embedded Ray beside the workload's check for each case
    (3-4 s; that path has its own tests below)."""
    path = tmp_path / "sweep.yaml"
    if text is not None:  # None: the file as the test wrote it
        path.write_text(textwrap.dedent(text).replace("RESULTS", str(tmp_path / "results")))
    argv = [str(path), *args]
    if not process and "--runner" not in args:
        argv += ["--runner", "local"]
    if process:
        return subprocess.run([sys.executable, "-m", "raybench.sweep", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    from raybench.sweep import command as sweep

    out, err, cwd = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        os.chdir(ROOT)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = sweep.main(argv)
    finally:
        os.chdir(cwd)
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


def assert_rejected(tmp_path: Path, proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]  # the paragraph is the last line
    assert str(tmp_path / "sweep.yaml") in err and "Fix:" in err, err
    for f in fragments:
        assert f in err, (f, err)
    tables = [*tmp_path.rglob("results.parquet"), *tmp_path.rglob("history/*.parquet"),
              *tmp_path.rglob("history.parquet")]
    assert tables == []


CASES = {
    "malformed_yaml": ("name: bad\nsystem: {label: a\n", [], ["<yaml>", "line 3"]),
    "unknown_key": (SWEEP.replace("measure:", "mesure:"), [], ["mesure", "'measure'"]),
    "wrong_type": (SWEEP, ["--set", "measure.warmup_steps=abc"], ["measure.warmup_steps"]),
    "empty_grid": (SWEEP, ["--set", "grid.batch_size=[]"], ["grid.batch_size"]),
    "zero_size": (SWEEP, ["--set", "workload.batch_size=0"], ["batch_size"]),
    "negative_size": (SWEEP, ["--set", "workload.image_size=-32"], ["image_size"]),
    "warmup_not_below_steps": (SWEEP, ["--set", "measure.warmup_steps=3"], ["warmup_steps"]),
    "unknown_workload": (SWEEP.replace("name: resnet", "name: resnett"), [],
                         ["resnett", "resnet", "vit_tiles"]),
    "missing_data_dir": (SWEEP, ["--set", "workload.data=imagefolder",
                                 "--set", "workload.data_path=/nonexistent/imgs"], ["data_path"]),
    # values that would pass and only fail inside a trial, or outside output.root (issue 41)
    "set_yaml_error": (SWEEP, ["--set", "measure.measure_steps=[1,"],
                       ["--set measure.measure_steps", "malformed YAML"]),
    "non_ascii_name": (SWEEP, ["--set", "name=été"], ["name='été'", "ASCII"]),
    "parent_directory_name": (SWEEP, ["--set", "name=.."], ["name='..'"]),
    "duplicate_section": (SWEEP + "measure: {warmup_steps: 2}\n", [],
                          ["duplicate key 'measure'", "first at line 8"]),
    "infinite_window": (SWEEP, ["--set", "measure.measure_steps=null",
                                "--set", "measure.measure_seconds=.inf"],
                        ["measure.measure_seconds", "finite"]),
    "infinite_deadline": (SWEEP, ["--set", "execution.start_timeout_s=.inf"],
                          ["execution.start_timeout_s", "finite"]),
    "nan_learning_rate": (SWEEP, ["--set", "workload.lr=.nan"], ["workload.lr", "finite"]),
    "nul_in_env": (SWEEP, ["--set", 'hardware.env={X: "a\\0b"}'], ["hardware.env", "NUL"]),
    "grid_too_large": (SWEEP, ["--set", f"grid.seed={list(range(5001))}"],
                       ["10002 combinations", "execution.max_trials"]),
    "no_such_trial": (SWEEP, ["--trials", "1,99"], ["no trial [99]", "0 to 1"]),
    # issue 63, items 3 and 6: each of these was a traceback, a silent merge or a whole grid
    "deep_yaml_file": (SWEEP + "x: " + "[" * 1200 + "]" * 1200 + "\n", [],
                       ["<yaml>", "nested deeper"]),
    "deep_yaml_set": (SWEEP, ["--set", "measure.warmup_steps=" + "[" * 1200 + "]" * 1200],
                      ["--set measure.warmup_steps", "nested deeper"]),
    "set_grid_over_empty_grid": (SWEEP.replace("grid: {batch_size: [4, 8]}", "grid:"),
                                 ["--set", "grid.batch_size=[8]", "--set", "grid.seed=1"],
                                 ["grid.seed=1", "non-empty list"]),
    "set_grid_over_a_list": (SWEEP.replace("grid: {batch_size: [4, 8]}", "grid: [1, 2]"),
                             ["--set", "grid.batch_size=[8]"], ["grid=[1, 2]", "--set"]),
    "scalar_axis_by_set": (SWEEP, ["--set", "grid.cpu_workers=2"],
                           ["grid.cpu_workers=2", "non-empty list", "[value]"]),
    "scalar_axis_in_file": (SWEEP.replace("grid: {batch_size: [4, 8]}",
                                          "grid: {batch_size: 8}"), [],
                            ["grid.batch_size=8", "non-empty list"]),
    "bytes_in_an_axis": (SWEEP.replace("grid: {batch_size: [4, 8]}",
                                       "grid: {seed: [1, !!binary aGk=]}"), [],
                         ["grid.seed[1]", "bytes"]),
    "one_value_twice": (SWEEP, ["--set", "grid.batch_size=[8, 8]"],
                        ["grid.batch_size=[8, 8]", "one value once validated"]),
    "empty_trials": (SWEEP, ["--trials", ""], ["--trials=''", "not a list of trial indices"]),
    "a_trial_twice": (SWEEP, ["--trials", "0,0"], ["--trials='0,0'", "more than once"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_spec_errors(tmp_path, case):
    text, args, fragments = CASES[case]
    assert_rejected(tmp_path, run_cli(tmp_path, text, *args), *fragments)


def test_a_binary_file_is_named(tmp_path):
    (tmp_path / "sweep.yaml").write_bytes(b"name: \xf2\x00\xff" * 10)
    proc = run_cli(tmp_path, None)
    assert_rejected(tmp_path, proc, "not UTF-8")


def test_an_alias_bomb_is_named_in_a_line(tmp_path):
    """A million elements that are references to ten: the error shows a few of them."""
    anchors = ["x: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    anchors += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]
    text = SWEEP.replace("grid: {batch_size: [4, 8]}", "grid:\n  batch_size: *a5")
    proc = run_cli(tmp_path, "\n".join(["anchors:", *("  " + a for a in anchors)]) + text)
    assert_rejected(tmp_path, proc, "anchors")
    assert len(proc.stderr) < 1500, len(proc.stderr)


def test_output_directory_that_cannot_be_written(tmp_path):
    (tmp_path / "a_file").write_text("not a directory")
    proc = run_cli(tmp_path, SWEEP, "--output", str(tmp_path / "a_file" / "run"))
    assert_rejected(tmp_path, proc, "output.dir", "cannot be written")


@pytest.mark.ray
def test_a_workload_error_ends_the_ray_started_beside_its_check(tmp_path, monkeypatch):
    """Also: the embedded Ray is one of its own though `ray start` left its address file on this
    machine (ray.init without an address joined that cluster, and with num_cpus raised)."""
    import ray

    from raybench.runners.on_ray import cluster

    connect, calls = cluster.connect, []
    monkeypatch.setattr(cluster, "connect", lambda address: calls.append(address) or
                        connect(address))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    # Ray's temp folder, short (its socket paths have a length limit), holding the address
    # file `ray start` writes, naming a head where nothing listens
    # (a Ray process still ending may write a log as it goes: cleanup errors are not the test)
    with tempfile.TemporaryDirectory(prefix="rb", dir="/tmp",
                                     ignore_cleanup_errors=True) as ray_tmp:
        (Path(ray_tmp) / "ray").mkdir()
        (Path(ray_tmp) / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
        monkeypatch.setenv("RAY_TMPDIR", ray_tmp)
        proc = run_cli(tmp_path, SWEEP, "--set", "workload.batch_size=0", "--runner", "ray")
        assert calls == [None]  # the sections were valid: Ray started while resnet was imported
        assert_rejected(tmp_path, proc, "workload.batch_size")
        assert not ray.is_initialized()  # and it ended with the run that started it


def test_a_file_error_starts_no_ray(tmp_path, monkeypatch):
    from raybench.runners.on_ray import cluster

    def connect(address):
        raise AssertionError("Ray started for a sweep file with a typo")

    monkeypatch.setattr(cluster, "connect", connect)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    proc = run_cli(tmp_path, SWEEP.replace("measure:", "mesure:"), "--runner", "ray")
    assert_rejected(tmp_path, proc, "mesure")


@pytest.mark.ray
def test_gpus_asked_of_a_cluster_without_gpus(tmp_path):
    proc = run_cli(tmp_path, SWEEP, "--set", "hardware.num_gpus=1", "--output",
                   str(tmp_path / "results" / "run"), process=True)
    assert_rejected(tmp_path, proc, "hardware.num_gpus", "ask for GPUs", "has none")
    assert not (tmp_path / "results" / "run").exists()  # not even an empty run directory


def test_an_address_where_no_ray_answers_is_named_within_seconds(tmp_path):
    """`ray.init` on such an address retried for over two minutes; raybench asks first."""
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t0 = time.monotonic()
    proc = run_cli(tmp_path, SWEEP, "--runner", "ray", "--address", f"127.0.0.1:{port}",
                   "--output", str(tmp_path / "results" / "run"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert f"no Ray cluster answers at 127.0.0.1:{port}" in err and "Fix:" in err, err
    assert not (tmp_path / "results" / "run").exists()
    assert time.monotonic() - t0 < 30


@pytest.fixture(scope="module")
def scenes(tmp_path_factory):
    """Two small synthetic scenes in the real layout."""
    from raybench.data.synth_xview3 import generate

    root = tmp_path_factory.mktemp("x3")
    generate(root, 2, 600, 600, seed=3)
    split = next(s for s in ("train", "validation") if any((root / s).glob("*")))
    return root, split


def stage_sweep(scenes_dir: Path, labels: Path) -> str:
    return f"""
name: bad_stage
system: {{label: test-cpu}}
preprocess: {{scenes: {scenes_dir}, labels: {labels}, chip_size: 200, out: CHIPS}}
output: {{root: RESULTS}}
"""


def test_corrupt_geotiff_is_named(tmp_path, scenes):
    import shutil

    root, split = scenes
    copy = tmp_path / "scenes"
    shutil.copytree(root / split, copy)
    victim = sorted(copy.glob("*/VV_dB.tif"))[0]
    victim.write_bytes(b"II*\x00" + b"\x00garbage" * 50)
    text = stage_sweep(copy, root / "labels" / f"{split}.csv").replace(
        "CHIPS", str(tmp_path / "chips"))
    assert_rejected(tmp_path, run_cli(tmp_path, text), "preprocess.scenes", str(victim),
                    "not a readable GeoTIFF")


@pytest.mark.parametrize("damage", ["missing_columns", "negative_rows"])
def test_bad_label_csv_is_named(tmp_path, scenes, damage):
    root, split = scenes
    labels = pd.read_csv(root / "labels" / f"{split}.csv")
    if damage == "missing_columns":
        labels = labels.drop(columns=["detect_scene_row", "vessel_length_m"])
        want = "missing label columns"
    else:
        labels.loc[0, "detect_scene_row"] = -5
        want = "negative values"
    bad = tmp_path / "labels.csv"
    labels.to_csv(bad, index=False)
    text = stage_sweep(root / split, bad).replace("CHIPS", str(tmp_path / "chips"))
    assert_rejected(tmp_path, run_cli(tmp_path, text), "preprocess.labels", str(bad), want)


def test_safe_yaml_loader_refuses_python_tags(tmp_path):
    text = SWEEP.replace("name: tiny", "name: !!python/object/apply:os.system ['touch PWNED']")
    assert "!!python" in text
    proc = run_cli(tmp_path, text, process=True)  # the exit status a shell sees, too
    assert proc.returncode == 2 and not (ROOT / "PWNED").exists()


def test_a_storage_uri_that_cannot_be_written_is_named(tmp_path, scenes, on_s3):
    """A chip output at a URI is probed with a write before anything runs (the bucket here
    does not exist on the test's S3 server)."""
    root, split = scenes
    where = "s3://no-such-bucket-rb/chips"
    text = stage_sweep(root / split, root / "labels" / f"{split}.csv").replace("CHIPS", where)
    assert_rejected(tmp_path, run_cli(tmp_path, text), "preprocess.out", where,
                    "cannot write to", "AWS_ENDPOINT_URL")


def test_shared_storage_that_cannot_be_written_is_named(tmp_path, on_s3):
    where = "s3://no-such-bucket-rb/results"
    text = SWEEP.replace("output: {root: RESULTS}", f"output: {{root: RESULTS, storage: {where}}}")
    assert_rejected(tmp_path, run_cli(tmp_path, text), "output.storage", where,
                    "cannot write to", "AWS_ENDPOINT_URL")


def test_resume_of_a_run_whose_table_is_damaged_names_it(tmp_path):
    """Exit 2 naming the table and the command that rebuilds it (issue 41, item 7)."""
    import yaml

    from raybench.spec import load_sweep

    run = tmp_path / "run"
    run.mkdir()
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(SWEEP).replace("RESULTS", str(tmp_path / "results")))
    (run / "sweep.yaml").write_text(yaml.safe_dump(load_sweep(path).to_yaml_dict()))
    (run / "results.parquet").write_bytes(b"PAR1 cut short")
    proc = run_cli(tmp_path, None, "--resume", "--output", str(run))
    assert proc.returncode == 2, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()[-1]
    assert f"{run / 'results.parquet'} cannot be read" in err
    assert f"python -m raybench.rebuild {run}" in err
    assert (run / "results.parquet").read_bytes() == b"PAR1 cut short"


def test_a_full_disk_stops_with_exit_2_and_whole_files_and_resume_finishes(tmp_path,
                                                                           monkeypatch):
    """The filesystem fills as the second trial's row is written (issue 41, item 2): exit 2
    naming the run, the first row whole in the table and the history, no temporary left;
    `--resume` once there is space runs the second trial and nothing twice."""
    import errno

    from raybench.results import history, table

    real, calls = table.write_parquet, []

    def fills(frame, path):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(frame, path)

    monkeypatch.setattr(table, "write_parquet", fills)
    proc = run_cli(tmp_path, SWEEP)
    assert proc.returncode == 2, proc.stderr[-2000:]
    run = next((tmp_path / "results" / "tiny").iterdir())
    assert f"no space left at {run}" in proc.stderr and "--resume" in proc.stderr
    assert len(pd.read_parquet(run / "results.parquet")) == 1
    assert not [p for p in run.rglob(".*") if p.is_file() and p.name != ".lock"]
    monkeypatch.setattr(table, "write_parquet", real)
    proc = run_cli(tmp_path, None, "--resume", "--output", str(run))
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = pd.read_parquet(run / "results.parquet")
    assert len(rows) == 2 and rows["trial_key"].nunique() == 2
    assert len(history.read(tmp_path / "results")) == 2


def test_a_run_still_being_written_is_refused_until_its_sweep_ends(tmp_path):
    """`--resume` on a run whose sweep still runs exits 2 naming that sweep, and nothing is
    run twice; once that sweep is gone (even by SIGKILL) the run is free (issue 41, item 5)."""
    import signal

    import yaml

    from raybench.results import rundir
    from raybench.spec import load_sweep

    run = tmp_path / "run"
    run.mkdir()
    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(SWEEP).replace("RESULTS", str(tmp_path / "results")))
    (run / "sweep.yaml").write_text(yaml.safe_dump(load_sweep(path).to_yaml_dict()))
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom pathlib import Path\n"
         "from raybench.results.rundir import writing\nwith writing(Path(sys.argv[1]), 'x'):\n"
         "    print('held', flush=True)\n    time.sleep(600)\n", str(run)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = run_cli(tmp_path, None, "--resume", "--output", str(run))
        assert proc.returncode == 2, proc.stderr[-2000:]
        err = proc.stderr.strip().splitlines()[-1]
        assert f"is being written by a sweep still running (pid {holder.pid} on" in err, err
        assert not (run / "results.parquet").exists() and not (run / "trials").exists()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=60)
    with rundir.writing(run, "x"):  # the kernel released the killed holder's lock
        pass


def test_bench_overhead_refuses_a_trial_its_bare_loop_cannot_mirror(tmp_path):
    """Before Ray or any loop starts: a twin that ignored the setting would time another
    training. (A trial with no twin at all, several ranks or another workload, is set against
    torchrun alone: bench/twins.without_twin.)"""
    from raybench.bench import command as bench

    path = tmp_path / "sweep.yaml"
    path.write_text(textwrap.dedent(TINY_SWEEP))
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = bench.main(["overhead", str(path), "--set", "grid={}", "--set",
                         "workload.activation_checkpointing=true"])
    assert rc == 2
    assert str(path) in err.getvalue()
    assert "does not mirror workload.activation_checkpointing" in err.getvalue()


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "abc"])
def test_compare_refuses_a_threshold_that_is_no_per_cent(value, capsys):
    """NaN passed every comparison and called nothing slower; a negative threshold called
    every run slower (issue 63, item 3)."""
    from raybench import compare

    with pytest.raises(SystemExit) as exit_:
        compare.main(["a", "b", "--threshold-pct", value])
    assert exit_.value.code == 2 and "is not a threshold" in capsys.readouterr().err


def test_compare_on_a_table_it_cannot_use_and_an_index_over_a_foreign_one(tmp_path, capsys):
    """A truncated results.parquet and one without a status column were tracebacks in
    `compare`; a foreign table under a root was one in `report --index` (issue 63, item 3)."""
    from raybench import compare
    from raybench.report import write_index

    for name in ("base", "foreign", "truncated"):
        (tmp_path / "root" / name).mkdir(parents=True)
    pd.DataFrame({"trial_key": ["k"], "x": [1.0]}).to_parquet(
        tmp_path / "root" / "foreign" / "results.parquet")
    pd.DataFrame({"trial_key": ["k"], "status": ["ok"]}).to_parquet(
        tmp_path / "root" / "base" / "results.parquet")
    whole = (tmp_path / "root" / "base" / "results.parquet").read_bytes()
    (tmp_path / "root" / "truncated" / "results.parquet").write_bytes(whole[: len(whole) // 2])
    for bad, fragment in (("foreign", "no status column"), ("truncated", "cannot be read")):
        code = compare.main([str(tmp_path / "root" / "base"), str(tmp_path / "root" / bad)])
        err = capsys.readouterr().err
        assert code == 2 and fragment in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1
    page = write_index(tmp_path / "root").read_text()
    assert "foreign" in page and "unreadable" in page


MARGINS = {
    "integer_key": ("1: 5\n", "mapping of margin: value"),
    "huge_number": (f"peer_warn_pct: {'9' * 400}\n", "too large a number"),
    "key_twice": ("peer_warn_pct: 5\npeer_warn_pct: 6\n", "duplicate key"),
    "true_for_a_share": ("peer_warn_pct: true\n", "peer_warn_pct"),
    "warn_past_fail": ("peer_warn_pct: 25\npeer_fail_pct: 20\n", "must be below"),
    "deep": ("x: " + "[" * 1200 + "]" * 1200 + "\n", "nested deeper"),
}


@pytest.mark.parametrize("case", list(MARGINS))
def test_a_margins_file_that_cannot_be_used_is_named(tmp_path, case):
    """Each was a traceback, a silent merge or a wrong value (issue 63, item 3)."""
    from raybench.validate.verdict import MarginsError, load_margins

    text, fragment = MARGINS[case]
    path = tmp_path / "margins.yaml"
    path.write_text(text)
    with pytest.raises(MarginsError, match=fragment) as e:
        load_margins(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)
    path.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(MarginsError, match="cannot read the margins file"):
        load_margins(path)


@pytest.mark.parametrize("address", [":::::", "ray://nohost.invalid:10001", "http://h:80"])
def test_validate_names_an_address_that_is_no_cluster_at_once(address, capsys, monkeypatch):
    """`:::::` was a traceback at once, ray:// one after 31 s (issue 63, item 3)."""
    import time

    from raybench.validate import command

    # as from a fresh process, whatever Ray an earlier test of this worker left connected
    monkeypatch.setattr(command.cluster.ray, "is_initialized", lambda: False)
    t0 = time.monotonic()
    assert command.main(["--address", address]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("raybench: ") and "Fix:" in err and "Traceback" not in err, err
    assert time.monotonic() - t0 < 15


def test_a_port_that_answers_but_is_no_ray_is_named(capsys, monkeypatch):
    """10.255.255.1:6379 where the network accepts every connection (this VM's): the TCP
    check passed and ray.init's ConnectionError was a traceback after 21 s (issue 63,
    item 3). A listening socket that is no Ray stands for it; ray.init fails as it did."""
    import socket

    from raybench.validate import command

    def no_ray(address, **_):
        raise ConnectionError(f"Failed to connect to Ray cluster at {address}")

    monkeypatch.setattr(command.cluster.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(command.cluster.ray, "init", no_ray)
    with socket.create_server(("127.0.0.1", 0)) as server:
        address = f"127.0.0.1:{server.getsockname()[1]}"
        assert command.main(["--address", address]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "the port accepts connections" in err and "Fix:" in err, err


def test_validate_sets_how_its_probes_launch_and_nothing_else(tmp_path, monkeypatch, capsys):
    """`validate --set execution.start_timeout_s=120` reaches every probe's sweep after the
    suite's own settings; a key of the probes themselves is refused (exit 2, the key and the
    fix) before any Ray starts: two validations of a machine measure the same."""
    from raybench.validate import command

    connected, argvs = [], []
    monkeypatch.setattr(command.cluster, "connect", lambda a: connected.append(a) or False)
    monkeypatch.setattr(command.cluster, "nodes", lambda: [{"CPU": 2.0, "node:10.0.0.1": 1.0}])
    monkeypatch.setattr(command.sweep, "main", lambda argv: argvs.append(argv) or 143)
    assert command.main(["--set", "workload.size=8", "--output", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--set workload.size=8" in err and "Fix:" in err and "execution." in err
    assert connected == [] and argvs == []
    assert command.main(["--set", "execution.start_timeout_s=120",
                         "--output", str(tmp_path / "v")]) == 143  # the first probe's sweep
    (argv,) = argvs
    assert argv[0].endswith("matmul.yaml")
    assert argv[-4:] == ["--set", "grid.node=['10.0.0.1']", "--set",
                         "execution.start_timeout_s=120"]


def test_validate_stopped_by_a_signal_ends_as_a_sweep_does(tmp_path, monkeypatch, capsys):
    """SIGTERM while a probe's sweep ran: that sweep returns 143 with its rows whole; validate
    ended with a RuntimeError traceback, and now says so in one line with the same code
    (issue 63, item 6)."""
    from raybench.validate import command

    monkeypatch.setattr(command.cluster, "connect", lambda address: False)
    monkeypatch.setattr(command.cluster, "nodes", lambda: [{"CPU": 2.0}])
    monkeypatch.setattr(command.sweep, "main", lambda argv: 143)
    assert command.main(["--output", str(tmp_path / "v")]) == 143
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("raybench: validate interrupted by signal 15"), err
    assert not any("Traceback" in line for line in err)


def test_a_killed_torchrun_drivers_work_folder_is_cleared_at_the_next_start(tmp_path):
    """A driver killed by SIGKILL never removed its folder (issue 63, item 6); one whose
    driver still runs stays."""
    from raybench.runners.torchrun import WORK_PREFIX, clear_stale_work

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    stale = tmp_path / f"{WORK_PREFIX}{done.stdout.strip()}-abc"
    live = tmp_path / f"{WORK_PREFIX}{os.getpid()}-def"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "trial.pkl").write_bytes(b"x")
    assert clear_stale_work(str(tmp_path)) == [stale]
    assert not stale.exists() and live.exists()
