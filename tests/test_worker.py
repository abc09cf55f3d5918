"""The timed loop and the resnet workload in-process (no Ray): every hardware axis on CPU."""

from __future__ import annotations

import gc
import math
import statistics
import time

import pytest
import torch

from raybench.clock import StepClock
from raybench.context import WorkerContext
from raybench.grid import expand
from raybench.rank.loop import measure_rank
from raybench.report.assess import validity
from raybench.runners.local import run_local
from raybench.spec import SpecError, load_sweep
from tests.conftest import gloo_group, spawn_ranks


def one_trial(write_sweep, *overrides):
    spec = load_sweep(write_sweep(), ["grid={}", *overrides])
    (trial,) = expand(spec)
    return trial


def cpu_ctx(trial):
    return WorkerContext(0, 0, 1, 0, torch.device("cpu"), trial.hardware)


def test_record_has_every_field(write_sweep):
    trial = one_trial(write_sweep)
    r = measure_rank(trial, cpu_ctx(trial))
    assert len(r.compute_s) == len(r.wait_s) == 3
    assert len(r.warmup_s) == 1 and r.warmup_windows == 0
    assert all(c > 0 for c in r.compute_s)
    assert r.params == sum(p.numel() for p in torch.nn.Module.parameters(
        __import__("torchvision").models.resnet18(num_classes=10)))
    assert r.peak_allocated_mb is None and r.rss_peak_mb > 0
    assert 0 < r.cpu_util_pct < 100 * 64  # a busy process, at most every core
    assert r.minor_faults_per_s >= 0 and r.heap == "fixed"  # memory.steady_heap, on glibc
    assert 0 <= r.run_wait_pct < 100 * 64  # Linux schedstat
    assert r.telemetry == [] and r.gpu == {}  # no NVML on CPU: empty, not an error
    assert r.loss_final > 0


# bf16 and fp16 convolutions are slow on a CPU without them (25 and 17 s of CPU here) and
# nothing is timed: at the lowest priority beside the other parts (background), which leaves
# it waiting for CPU for minutes while they run
@pytest.mark.background
@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "amp_fp16"])
def test_precisions_run_on_cpu(write_sweep, precision):
    trial = one_trial(write_sweep, f"hardware.precision={precision}")
    r = measure_rank(trial, cpu_ctx(trial))
    assert r.loss_final == r.loss_final  # not NaN


def test_math_mode_follows_precision_not_pytorch_defaults(write_sweep):
    # PyTorch's default runs cuDNN convolutions in TF32: an fp32 row must not
    for precision, mode in [("tf32", "tf32"), ("fp32", "ieee"), ("bf16", "ieee")]:
        trial = one_trial(write_sweep, f"hardware.precision={precision}")
        cpu_ctx(trial).set_math_mode()
        assert torch.backends.cuda.matmul.fp32_precision == mode
        assert torch.backends.cudnn.conv.fp32_precision == mode


def test_cudnn_autotuning_is_set_per_trial_and_a_grid_axis(write_sweep):
    torch.backends.cudnn.benchmark = False  # PyTorch's default
    trial = one_trial(write_sweep)
    assert trial.hardware.cudnn_benchmark is True  # on unless a sweep says otherwise
    cpu_ctx(trial).set_math_mode()
    assert torch.backends.cudnn.benchmark is True
    cpu_ctx(one_trial(write_sweep, "hardware.cudnn_benchmark=false")).set_math_mode()
    assert torch.backends.cudnn.benchmark is False
    path = write_sweep("name: c\nsystem: {label: a}\nworkload: {name: resnet, depth: 18}\n"
                       "grid: {cudnn_benchmark: [true, false]}\n")
    trials = expand(load_sweep(path))
    assert [t.hardware.cudnn_benchmark for t in trials] == [True, False]
    assert [t.to_dict()["hardware"]["cudnn_benchmark"] for t in trials] == [True, False]


def test_autocast_dtype_applies(write_sweep):
    trial = one_trial(write_sweep, "hardware.precision=bf16")
    ctx = cpu_ctx(trial)
    with ctx.autocast():
        y = torch.nn.Linear(4, 4)(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16
    assert ctx.grad_scaler() is None
    fp16 = one_trial(write_sweep, "hardware.precision=amp_fp16")
    assert cpu_ctx(fp16).grad_scaler() is not None


def test_channels_last_model_and_inputs(write_sweep):
    trial = one_trial(write_sweep, "hardware.channels_last=true")
    ctx = cpu_ctx(trial)
    model = ctx.prepare_model(torch.nn.Conv2d(3, 8, 3))
    assert model.weight.is_contiguous(memory_format=torch.channels_last)
    x = ctx.prepare_images(torch.randn(2, 3, 8, 8))
    assert x.is_contiguous(memory_format=torch.channels_last)
    measure_rank(trial, ctx)


@pytest.mark.parametrize("data", ["synthetic", "synthetic_device"])
@pytest.mark.parametrize("gpus", [0, pytest.param(1, marks=pytest.mark.gpu)])
def test_the_bare_twin_trains_as_the_trial_does(write_sweep, monkeypatch, data, gpus):
    """bench overhead's bare loop mirrors the trial's precision, memory format and input mode
    (seen from inside its model's first convolution), and refuses what it cannot mirror."""
    import torchvision

    from raybench.bench.twins import bare_loop

    seen = []
    build = torchvision.models.resnet18

    def spied(**kw):
        model = build(**kw)
        model.conv1.register_forward_hook(lambda _m, args, out: seen.append(
            (args[0].is_contiguous(memory_format=torch.channels_last), out.dtype)))
        return model

    monkeypatch.setattr(torchvision.models, "resnet18", spied)
    threads = torch.get_num_threads()
    if gpus:  # the twin answers for its own memory only: run after the CUDA-graph tests, the
        # process still held 392 MB after the twin's release (lent H200, 2026-11-27)
        gc.collect()
        torch.cuda.empty_cache()
        held = torch.cuda.memory_reserved()
    try:
        trial = one_trial(write_sweep, "hardware.precision=bf16", "hardware.channels_last=true",
                          f"workload.data={data}", f"hardware.num_gpus={gpus}")
        assert bare_loop(trial) > 0
        assert seen and set(seen) == {(True, torch.bfloat16)}
        seen.clear()
        assert bare_loop(one_trial(write_sweep, f"workload.data={data}",
                                   f"hardware.num_gpus={gpus}")) > 0
        assert set(seen) == {(False, torch.float32)}
        if gpus:  # the driver gives the twin's memory back before the trials beside it run
            # (ResNet-18's weights and momentum alone are 90 MB; cuBLAS keeps its workspace)
            assert torch.cuda.memory_reserved() - held < 64e6
    finally:
        torch.set_num_threads(threads)  # the twin sets the trial's threads, process-wide
    with pytest.raises(ValueError, match="activation_checkpointing"):
        bare_loop(one_trial(write_sweep, "workload.activation_checkpointing=true"))


def test_data_wait_is_measured_with_a_loader(write_sweep):
    trial = one_trial(write_sweep, "hardware.dataloader_workers=1")
    r = measure_rank(trial, cpu_ctx(trial))
    assert all(w > 0 for w in r.wait_s)
    resident = one_trial(write_sweep, "workload.data=synthetic_device")
    r2 = measure_rank(resident, cpu_ctx(resident))
    assert max(r2.wait_s) < min(r2.compute_s)


def test_time_window_becomes_agreed_step_count(write_sweep):
    trial = one_trial(write_sweep, "measure={warmup_steps: 2, measure_seconds: 0.5}")
    r = measure_rank(trial, cpu_ctx(trial))
    steps = r.steps_per_window
    assert steps == len(r.compute_s) >= 1
    assert 0.2 < r.windows_s[0] < 5.0


def test_repeats_give_one_window_each(write_sweep):
    trial = one_trial(write_sweep, "measure.repeats=3")
    r = measure_rank(trial, cpu_ctx(trial))
    assert len(r.windows_s) == 3 and len(r.compute_s) == 9


# two rank processes over gloo for 20 s of both cores in the parallel part, and nothing timed
# (the ranks' throughputs are summed, not judged): background
@pytest.mark.background
def test_local_runner_two_ranks_sum_throughput(write_sweep):
    trial = one_trial(write_sweep, "hardware.cpu_workers=2")
    out = run_local(trial)
    assert out.status == "ok", out.error
    ranks = out.ranks
    assert [r["rank"] for r in ranks] == [0, 1]
    total = sum(r["samples_per_s"] for r in ranks)
    assert out.metrics["train/samples_per_s"] == pytest.approx(total)
    assert out.metrics["train/global_batch_size"] == 8


def test_a_diverged_run_is_a_row_the_report_does_not_trust(write_sweep):
    # SGD at lr 1e9 turns the weights to inf/nan within a few steps: the step times are real,
    # the run is not training any more
    out = run_local(one_trial(write_sweep, "workload.lr=1e9"))
    assert out.status == "ok", out.error
    m = out.metrics
    assert not math.isfinite(m["train/loss_final"]) and m["train/loss_finite"] is False
    assert any("nan/inf" in r for r in validity({"status": "ok", **m}))
    fine = run_local(one_trial(write_sweep)).metrics
    assert fine["train/loss_finite"] is True
    assert not any("nan/inf" in r for r in validity({"status": "ok", **fine}))


def test_local_runner_gpu_trial_without_gpu_is_infeasible(write_sweep):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    out = run_local(one_trial(write_sweep, "hardware.num_gpus=1"))
    assert out.status == "infeasible" and "needs 1 GPUs" in out.error


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "tf32", "amp_fp16", "bf16"])
def test_cuda_trial_reports_memory(write_sweep, precision):
    trial = one_trial(write_sweep, "hardware.num_gpus=1", f"hardware.precision={precision}",
                      "hardware.channels_last=true")
    out = run_local(trial)
    assert out.status == "ok", out.error
    m = out.metrics
    assert m["mem/peak_allocated_mb"] > 0
    assert m["mem/peak_reserved_mb"] >= m["mem/peak_allocated_mb"]


def test_imagefolder_data(write_sweep, tmp_path):
    from PIL import Image

    for cls in ("boat", "sea"):
        (tmp_path / "imgs" / cls).mkdir(parents=True)
        for i in range(8):
            color = (i * 30, 100, 200) if cls == "boat" else (10, i * 30, 50)
            Image.new("RGB", (48, 40), color).save(tmp_path / "imgs" / cls / f"{i}.jpg")
    trial = one_trial(write_sweep, "workload.data=imagefolder",
                      f"workload.data_path={tmp_path / 'imgs'}", "workload.image_size=32")
    r = measure_rank(trial, cpu_ctx(trial))
    assert len(r.compute_s) == 3
    assert r.describe["input_shape"] == [3, 32, 32]


def test_profiler_trace_written_outside_the_window(write_sweep, tmp_path):
    import json

    trial = one_trial(write_sweep, "measure.profile_steps=2")
    out = run_local(trial, str(tmp_path))
    assert out.status == "ok", out.error
    path = tmp_path / f"{trial.index:04d}_{trial.key}.trace.json"
    assert out.records[0]["trace"] == str(path)
    assert "traceEvents" in json.loads(path.read_text())
    assert out.metrics["train/measured_steps"] == 3  # traced steps are not measured ones
    plain = run_local(one_trial(write_sweep), str(tmp_path / "none"))
    assert plain.records[0]["trace"] is None and not (tmp_path / "none").exists()


class _Sleeper:
    """A step of known length: 2 ms to get a batch, 6 ms of 'compute', a 'forward' phase."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.clock = StepClock(ctx.device)

    def batches(self):
        while True:
            time.sleep(0.002)
            yield 1

    def to_device(self, batch):
        return batch

    def step(self, batch):
        with self.clock.phase("forward"):
            time.sleep(0.006)
        return torch.tensor(1.0)


@pytest.mark.serial  # sleep-paced steps timed to the millisecond: alone
def test_window_sync_agrees_with_step_sync_on_cpu(write_sweep):
    from raybench.rank.loop import Steps, _run_windows, _timed_step

    ctx = cpu_ctx(one_trial(write_sweep))
    w = _Sleeper(ctx)
    s = Steps(w, w.batches(), w.clock, ctx)
    step = [_timed_step(s) for _ in range(20)]
    w.clock.phase_s.clear()
    run = _run_windows(s, 20, 1, sync="window")
    waits, compute = run["wait_s"], run["compute_s"]
    assert len(waits) == len(compute) == len(w.clock.phase_s["forward"]) == 20
    assert not w.clock._pending
    assert sum(waits) + sum(compute) == pytest.approx(run["windows_s"][0], rel=0.03)
    med = statistics.median
    assert med(waits) == pytest.approx(med(s[0] for s in step), rel=0.3, abs=3e-4)
    assert med(compute) == pytest.approx(med(s[1] for s in step), rel=0.1)
    assert 0.006 <= med(w.clock.phase_s["forward"]) < 0.008
    # the windows' own step loop under `sync: step` times a step as _timed_step does
    again = _run_windows(s, 20, 1, sync="step")
    assert len(again["wait_s"]) == len(again["compute_s"]) == 20
    assert med(again["compute_s"]) == pytest.approx(med(s[1] for s in step), rel=0.1)
    assert med(again["wait_s"]) == pytest.approx(med(s[0] for s in step), rel=0.3, abs=3e-4)


class _Paced(_Sleeper):
    """_Sleeper whose compute takes `pace(window)` seconds in each window of `steps` steps."""

    def __init__(self, ctx, steps, pace):
        super().__init__(ctx)
        self.steps, self.pace, self.n = steps, pace, 0

    def samples_per_step(self):
        return 4

    def step(self, batch):
        with self.clock.phase("forward"):
            time.sleep(self.pace(self.n // self.steps))
        self.n += 1
        return torch.tensor(1.0)


def _windows(write_sweep, pace, most, repeats=3, steps=5):
    from raybench.rank.loop import Steps, _run_windows

    ctx = cpu_ctx(one_trial(write_sweep))
    w = _Paced(ctx, steps, pace)
    return _run_windows(Steps(w, w.batches(), w.clock, ctx), steps, repeats, most), w.clock


@pytest.mark.serial  # sleep-paced steps timed to the millisecond: alone
def test_a_slow_first_window_becomes_warmup(write_sweep):
    # the first window at 3x the steady step time (a clock ramping up, a neighbour's burst)
    run, clock = _windows(write_sweep, lambda k: 0.09 if k == 0 else 0.03, most=5)
    extra = run["warmup_windows"]
    assert extra in (1, 2)  # the slow one, and at most one more if the steady ones were noisy
    assert len(run["windows_s"]) == 3 and max(run["windows_s"]) < 0.3  # 5 x 32 ms kept
    assert len(run["wait_s"]) == len(run["compute_s"]) == len(clock.phase_s["forward"]) == 15
    assert len(run["warm"]) == 5 * extra and min(c for _, c, _ in run["warm"][:5]) > 0.08
    assert min(clock.phase_s["forward"]) < 0.05  # the slow window's phases left with it
    # CPU time and GPU telemetry are then read from the first kept window's start
    since = time.perf_counter() - run["kept_from"]["wall"]
    assert since == pytest.approx(sum(run["windows_s"]), abs=0.02)
    assert time.monotonic() - run["kept_from"]["t"] == pytest.approx(since, abs=0.02)


@pytest.mark.serial  # sleep-paced steps timed to the millisecond: alone
def test_windows_that_never_agree_stop_at_max_repeats(write_sweep):
    run, clock = _windows(write_sweep, lambda k: 0.01 if k % 2 == 0 else 0.04, most=5)
    assert run["warmup_windows"] == 2  # five run, the last three kept: fast, slow, fast
    fast, slow, fast2 = run["windows_s"]
    assert slow > 2 * max(fast, fast2)
    assert len(run["warm"]) == 10 and len(clock.phase_s["forward"]) == 15
    assert run["window_steps"] == [5, 5, 5]


def _paced_rank(rank: int, port: int, out: str) -> None:
    import json
    from pathlib import Path

    from raybench.rank.loop import Steps, _run_windows
    from raybench.spec import HardwareSpec

    with gloo_group(rank, port):
        ctx = WorkerContext(rank, rank, 2, 0, torch.device("cpu"), HardwareSpec(cpu_workers=2))
        # only rank 1's first window is slow: rank 0 alone would see nothing to drop
        w = _Paced(ctx, 5, lambda k: 0.09 if rank == 1 and k == 0 else 0.03)
        run = _run_windows(Steps(w, w.batches(), w.clock, ctx), 5, 3, 5)
        Path(f"{out}.{rank}").write_text(json.dumps(
            {"extra": run["warmup_windows"], "windows": len(run["windows_s"])}))


@pytest.mark.serial  # sleep-paced steps timed to the millisecond: alone
def test_ranks_run_the_same_windows_and_drop_the_same(tmp_path):
    import json

    spawn_ranks(_paced_rank, str(tmp_path / "rank"))
    ranks = [json.loads((tmp_path / f"rank.{r}").read_text()) for r in (0, 1)]
    assert ranks[0] == ranks[1] and ranks[0]["windows"] == 3 and ranks[0]["extra"] >= 1, ranks


@pytest.mark.serial  # sleep-paced steps timed to the millisecond: alone
@pytest.mark.parametrize("most, repeats", [(None, 3), (5, 1)])
def test_without_max_repeats_the_windows_are_fixed(write_sweep, most, repeats):
    # (one window has nothing to agree with: max_repeats does not apply to it)
    run, _ = _windows(write_sweep, lambda k: 0.01 if k % 2 == 0 else 0.04, most, repeats)
    assert run["warmup_windows"] == 0 and run["warm"] == []
    assert len(run["windows_s"]) == repeats


def test_window_sync_through_a_real_trial(write_sweep):
    rec = {}
    for sync in ("step", "window"):
        trial = one_trial(write_sweep, f"measure.sync={sync}", "measure.measure_steps=6")
        assert trial.to_dict()["measure"]["sync"] == sync  # recorded in the row's config
        rec[sync] = measure_rank(trial, cpu_ctx(trial))
    for r in rec.values():
        assert len(r.compute_s) == len(r.wait_s) == 6 and min(r.compute_s) > 0
        # the steps tile the window: nothing of it is left out of the step times
        steps_s = sum(r.wait_s) + sum(r.compute_s)
        assert steps_s == pytest.approx(sum(r.windows_s), rel=0.03)


def test_window_sync_is_refused_for_epoch_workloads(write_sweep):
    path = write_sweep("name: x\nsystem: {label: a}\nworkload: {name: xview3_frcnn}\n"
                       "measure: {sync: window}\n")
    with pytest.raises(SpecError, match="measure.sync='window'.*measures whole epochs"):
        expand(load_sweep(path))


@pytest.mark.gpu
def test_window_sync_on_gpu_keeps_the_run_ahead(write_sweep):
    """A launch-bound model: syncing every step can only slow it; the event step times add up
    to the window they were recorded in. Three rounds, alternating which side goes first, and
    each side's best window, as timeit takes the fastest run. The batch is resident: with host
    batches (a DataLoader in this process, pinned) the step is the host's loading as much as
    its launches, and window sync read slower on both lent cards (H100, one round: 102.6
    against 106.3 steps/s; H200, three rounds: 78.4-84.6 against 84.7-96.6), a case
    `docs/results/2026-11-27_h100_ray/window_probe.py` measures beside this one."""
    rates: dict[str, list[float]] = {"step": [], "window": []}
    for round_ in range(3):
        for sync in ("step", "window") if round_ % 2 == 0 else ("window", "step"):
            trial = one_trial(write_sweep, "hardware.num_gpus=1", "hardware.precision=bf16",
                              "workload.batch_size=8", "workload.data=synthetic_device",
                              f"measure.sync={sync}", "measure.measure_steps=50")
            ctx = WorkerContext(0, 0, 1, 0, torch.device("cuda", 0), trial.hardware)
            r = measure_rank(trial, ctx)
            rates[sync].append(len(r.compute_s) / sum(r.windows_s))
            if sync == "window":
                total = sum(r.wait_s) + sum(r.compute_s)
                assert total == pytest.approx(sum(r.windows_s), rel=0.05)
    assert max(rates["window"]) >= 0.97 * max(rates["step"]), rates
