#!/usr/bin/env bash
# Issue 44's fourth device run (the first on an H100 through Ray), from the project root with
# `.gpu/a` carried (Ray 2.60 and the packages the GPU image lacks, from ../shared/gpu/ray-bundle;
# no rasterio: no xView3 step here). pytest is the image's own.
#   bash docs/results/2026-11-27_h100_ray/run.sh DEADLINE_S STEP...
# runs the steps in order while DEADLINE_S seconds last (a step that would start with under 20 s
# left is skipped and said so), each under its own time limit. Every step's run directory goes
# under runs/; after each step runs/ is packed into $OUT/runs.tar.gz (no pages or traces) and
# the log is $OUT/log.txt, so what ran comes back even when a later step fails or the call's
# limit cuts it. The fifth run (an H200, 2026-11-27 evening, ../2026-11-27_h200_ray/) used it as
# it was at b153710; window_probe, vit_inf_ab and the /proc/stat lines came after it.
set -u
here=docs/results/2026-11-27_h100_ray
sw=$here/sweeps
py=python3
out=${OUT:-/tmp/out}
mkdir -p "$out" runs
log=$out/log.txt

sweep() { $py -m raybench.sweep "$@"; }
step() {
  case $1 in
    facts)
      nvidia-smi -q > runs/nvidia-smi.txt 2>&1
      nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,pcie.link.gen.max,uuid --format=csv
      nproc; free -g | head -2
      $py -c "import sys, torch, ray, pydantic, numpy, pandas, pyarrow, pytest
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(),
      'ray', ray.__version__, 'pydantic', pydantic.__version__, 'numpy', numpy.__version__,
      'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__, 'pytest', pytest.__version__)
print(torch.cuda.get_device_name(0), torch.cuda.device_count())"
      git log -1 --format='code %h %s' 2>/dev/null || true ;;
    gpu_tests)  # every test marked gpu (skipped on CPU machines): the CUDA-graph capture recipe
      # moved into workloads/_graphs.capture after the last GPU run
      $py -m pytest -q -p no:cacheprovider -m gpu -rs \
        tests/test_graphs.py tests/test_vit_tiles.py tests/test_worker.py ;;
    # ResNet-50 bf16 on resident data, three windows a trial, Ray then in-process
    ratio_ray) sweep $sw/resnet50.yaml --output runs/ratio_ray ;;
    ratio_local) sweep $sw/resnet50.yaml --runner local --output runs/ratio_local ;;
    # ViT-L tiles, train and inference at two tiles, three windows a trial
    vit_ray) sweep $sw/vit_tiles.yaml --output runs/vit_ray ;;
    vit_local) sweep $sw/vit_tiles.yaml --runner local --output runs/vit_local ;;
    # the same, each trial's windows going on (up to 6) while its last three disagree: the
    # tile-256 windows ramped up in-process on the H100
    vit_ray6) sweep $sw/vit_tiles.yaml --output runs/vit_ray6 --set measure.max_repeats=6 ;;
    vit_local6) sweep $sw/vit_tiles.yaml --runner local --output runs/vit_local6 \
        --set measure.max_repeats=6 ;;
    # Offline after 111c006 (one replica call per batch number), and again after the pass's
    # tasks of several calls and its clock (2026-11-27, offline.replica_pool, pass_seconds);
    # Server with dynamic batching after 45038e7 (a replica warms every call size it will be sent)
    offline_ray) sweep $sw/inference.yaml --output runs/offline_ray ;;
    server_batch) sweep $sw/server_graphs.yaml --output runs/server_batch \
        --set inference.max_batch_queries=8 ;;
    # tf32 side by side; on Ray the two batch sizes share one worker group (its later trial's
    # fixed cost on a GPU)
    tf32_ray) sweep $sw/resnet50.yaml --output runs/tf32_ray \
        --set hardware.precision=tf32 --set execution.isolation=worker ;;
    tf32_local) sweep $sw/resnet50.yaml --runner local --output runs/tf32_local \
        --set hardware.precision=tf32 ;;
    overhead)  # issue 42: Ray, torchrun and the bare loop, alternating rounds; three rounds,
      # since two give the paired ratio's t interval one degree of freedom (12.7 standard
      # errors wide each side) and so no verdict on the 0.99 goal
      $py -m raybench.bench overhead $sw/resnet50.yaml --rounds 3 --set 'grid={batch_size: [256]}' ;;
    overhead_window)  # the H200 run: Ray and torchrun both 2.3% under the bare loop, which
      # synchronises only at its window's ends; the same three rounds with sync: window
      $py -m raybench.bench overhead $sw/resnet50.yaml --rounds 3 --set 'grid={batch_size: [256]}' \
        --set measure.sync=window ;;
    overhead_group)  # issue 42's fixed-cost goal: a worker group's later trials against
      # torchrun's start per trial (one round of three trials; the throughput verdict is the
      # step above's)
      $py -m raybench.bench overhead $sw/resnet50.yaml --rounds 1 --trials-per-round 3 \
        --set 'grid={batch_size: [256]}' --set execution.isolation=worker ;;
    # 2026-11-27 on the H200: window sync read slower than step sync in the gpu test (host
    # batches); both data modes, both syncs, alternating (window_probe.py says what it runs)
    window_probe) $py $here/window_probe.py ;;
    # the same day: ViT-L inference at tile 256 ran at 803 tiles/s through Ray against 1,412
    # in-process (forward p50 9.1 against 5.4 ms), where the H100 run had 5.28 against 5.27:
    # that trial alone, Ray and in-process in turn, twice, each with 20 profiled forwards after
    # its windows, whose traces trace_summary.py sums up here (the traces stay behind)
    vit_inf_ab)
      for i in 1 2; do
        for runner in ray local; do
          sweep $sw/vit_tiles.yaml --runner $runner --output runs/vit_inf_${runner}$i \
            --set 'grid={mode: [inference], tile: [256]}' --set measure.max_repeats=6 \
            --set measure.profile_steps=20
        done
      done
      $py $here/trace_summary.py runs/vit_inf_*/trials/*.trace.json ;;
    # Issue 67 items 2 and 3 (prepared 2026-11-28, not yet run): LLM training and serving.
    # The 1B preset's four layouts first, then both presets; Ray against torchrun on one trial
    llm_train_1b) sweep $sw/llm_train.yaml --output runs/llm_train_1b \
        --set 'grid.preset=[llama3.2-1b]' ;;
    llm_train) sweep $sw/llm_train.yaml --output runs/llm_train ;;
    llm_overhead) $py -m raybench.bench overhead $sw/llm_train.yaml --rounds 3 \
        --set 'grid={preset: [llama3.2-1b], seq_len: [4096]}' ;;
    # 8B bf16: Offline at four lengths, the Server search under both MLPerf limit sets at
    # 1000/128, the curve at 128/128, and in-process against through Ray
    llm_offline) sweep $sw/llm_serve.yaml --output runs/llm_offline ;;
    llm_server) sweep $sw/llm_serve.yaml --output runs/llm_server \
        --set inference.scenario=server \
        --set 'grid={limits: [mlperf-server, mlperf-interactive]}' \
        --set inference.input_tokens=1000 --set inference.output_tokens=128 ;;
    llm_curve) sweep $sw/llm_serve.yaml --output runs/llm_curve \
        --set inference.scenario=concurrency --set inference.concurrency=1 \
        --set 'grid={concurrency: [1, 4, 16, 64, 256]}' ;;
    # lengths drawn from a file (64-192 tokens in and out): with one length for all, the
    # users' requests start and end together, and on the VM the rounds moved about twice as
    # much (journal, fifteenth session)
    llm_serve_overhead) $py -m raybench.bench overhead $sw/llm_serve.yaml --rounds 3 \
        --set inference.scenario=concurrency --set inference.concurrency=64 \
        --set 'grid={concurrency: [64]}' --set inference.input_tokens=null \
        --set inference.output_tokens=null \
        --set inference.lengths_file=sweeps/lengths/spread_128_128.csv ;;
    *) echo "unknown step $1"; return 2 ;;
  esac
}

if [ "${1:-}" = step ]; then step "$2"; exit $?; fi

deadline=$1; shift
t0=$(date +%s)
if [ ! -d /tmp/site/ray ]; then
  mkdir -p /tmp/site && for f in .gpu/a/*.tar.xz; do tar xJf "$f" -C /tmp/site; done
  echo "=== unpacked in $(( $(date +%s) - t0 ))s" | tee -a "$log"
fi
export PYTHONPATH=/tmp/site:$PWD RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
for name in "$@"; do
  left=$(( deadline - ($(date +%s) - t0) ))
  case $name in
    # Ray trials cost ~20-30 s each beyond their windows on the H200 (2026-11-26 README)
    facts) max=30;; gpu_tests|ratio_local|tf32_local|offline_ray|vit_local) max=100;; ratio_ray|tf32_ray|server_batch) max=150;; vit_ray|vit_ray6) max=200;; window_probe) max=90;; vit_inf_ab) max=150;; overhead|overhead_group|overhead_window) max=300;; llm_train_1b|llm_offline|llm_curve) max=200;; llm_train|llm_server|llm_overhead|llm_serve_overhead) max=300;; vit_local6) max=150;; *) max=150;;
  esac
  limit=$(( max < left - 10 ? max : left - 10 ))
  if [ "$limit" -lt 20 ]; then echo "=== SKIP $name (${left}s left)" | tee -a "$log"; continue; fi
  echo "=== $name start $(date -u +%T), limit ${limit}s" | tee -a "$log"
  # the machine's CPU counters (user ... steal) around each step: a hypervisor taking the
  # vCPUs shows as steal
  grep '^cpu ' /proc/stat >> "$log"
  s=$(date +%s)
  timeout -k 10 "$limit" bash "$0" step "$name" >> "$log" 2>&1
  rc=$?
  grep '^cpu ' /proc/stat >> "$log"
  echo "=== $name rc=$rc in $(( $(date +%s) - s ))s" | tee -a "$log"
  tail -n 3 "$log" | grep -h '"raybench"' | cut -c1-300
  tar czf "$out/runs.tar.gz" --exclude='*.html' --exclude='*.trace.json' runs
done
