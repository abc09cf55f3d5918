#!/usr/bin/env bash
# Issue 44's third device run (an H200: the device tool's H100 was not free), from the project
# root, with `.gpu/s` carried (Ray 2.60 and what the GPU image lacks, rasterio included, as one
# xz archive for Python 3.12, made by slim-bundle.sh; and pytest with its dependencies, for the
# GPU tests, as pytest.tar.xz: `pip install --target DIR pytest`, then `tar cJf` of DIR):
#   bash docs/results/2026-11-26_h200_ray/run3.sh DEADLINE_S STEP...
# (it ran as docs/results/2026-11-26_h100_ray/run.sh, with its sweeps in sweeps/ beside it)
# runs the steps in order while DEADLINE_S seconds last (a step that would start with under 20 s
# left is skipped and said so), each under its own time limit. Every step's run directory goes
# under runs/; after each step runs/ is packed into $OUT/runs.tar.gz (no pages or traces) and
# the log is $OUT/log.txt, so what ran comes back even when a later step fails or the call's
# limit cuts it.
set -u
here=docs/results/2026-11-26_h200_ray
sw=${SWEEPS:-$here/sweeps3}
py=${PY:-python3}
out=${OUT:-/tmp/out}
mkdir -p "$out" runs
log=$out/log.txt

step() {
  case $1 in
    facts)
      nvidia-smi -q > runs/nvidia-smi.txt 2>&1
      nvidia-smi --query-gpu=name,driver_version,power.limit,clocks.max.sm,pcie.link.gen.max --format=csv
      nproc; free -g | head -2
      $py -c "import sys, torch, ray, pydantic, numpy, pandas, pyarrow
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda,
      'cudnn', torch.backends.cudnn.version(), 'nccl', torch.cuda.nccl.version(),
      'ray', ray.__version__, 'pydantic', pydantic.__version__, 'numpy', numpy.__version__,
      'pandas', pandas.__version__, 'pyarrow', pyarrow.__version__)
print(torch.cuda.get_device_name(0), torch.cuda.device_count())"
      git log -1 --format='code %h %s' 2>/dev/null || true ;;
    gpu_tests)  # every test marked gpu: skipped on CPU machines, never run before
      PYTHONPATH=${PYTHONPATH:-}:/tmp/pyt $py -m pytest -q -p no:cacheprovider -m gpu -rs \
        tests/test_graphs.py tests/test_vit_tiles.py tests/test_worker.py ;;
    server_graphs) $py -m raybench.sweep $sw/server_graphs.yaml --output runs/server_graphs ;;
    offline_ray) $py -m raybench.sweep $sw/inference.yaml --output runs/offline_ray ;;
    offline_local) $py -m raybench.sweep $sw/inference.yaml --runner local --output runs/offline_local ;;
    server_local) $py -m raybench.sweep $sw/server_graphs.yaml --runner local --output runs/server_local ;;
    server_batch)  # dynamic batching: a free replica takes up to 8 waiting queries in one call
      $py -m raybench.sweep $sw/server_graphs.yaml --output runs/server_batch \
        --set inference.max_batch_queries=8 ;;
    ratio_ray) $py -m raybench.sweep $sw/resnet50.yaml --output runs/ratio_ray ;;
    ratio_local) $py -m raybench.sweep $sw/resnet50.yaml --runner local --output runs/ratio_local ;;
    validate) $py -m raybench.validate --expect-gpus 1 --output runs/validate ;;
    # For the next GPU session (not run on 2026-11-26): the ratio with repeated windows for tf32
    # and the ViT-L tiles, and issue 42's throughput against torchrun and the bare loop
    ratio_tf32_ray|ratio_tf32_local)
      runner=ray; [ $1 = ratio_tf32_local ] && runner=local
      $py -m raybench.sweep $sw/resnet50.yaml --runner $runner --output runs/$1 \
        --set hardware.precision=tf32 ;;
    vit_ratio_ray|vit_ratio_local)
      runner=ray; [ $1 = vit_ratio_local ] && runner=local
      $py -m raybench.sweep $here/sweeps/vit_tiles.yaml --runner $runner --output runs/$1 \
        --set measure.repeats=3 ;;
    overhead)  # Ray, torchrun and the bare loop, alternating rounds, ResNet-50 bf16 through the loader
      $py -m raybench.bench overhead $sw/resnet50.yaml --rounds 3 --set 'grid={batch_size: [256]}' \
        --set workload.data=synthetic --set hardware.dataloader_workers=8 ${OVERHEAD_SETS:-} ;;
    *) echo "unknown step $1"; return 2 ;;
  esac
}

if [ "${1:-}" = step ]; then step "$2"; exit $?; fi

deadline=$1; shift
t0=$(date +%s)
if [ -z "${PY:-}" ] && [ ! -d /tmp/site/ray ]; then
  mkdir -p /tmp/site /tmp/pyt && tar xJf .gpu/s/site.tar.xz -C /tmp/site
  tar xJf .gpu/s/pytest.tar.xz -C /tmp/pyt
  echo "=== unpacked in $(( $(date +%s) - t0 ))s" | tee -a "$log"
fi
[ -z "${PY:-}" ] && export PYTHONPATH=/tmp/site:$PWD
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
for name in "$@"; do
  left=$(( deadline - ($(date +%s) - t0) ))
  case $name in
    # Ray trials cost ~25-32 s each on the H200 beyond their windows (README.md)
    facts) max=30;; gpu_tests|offline_ray|offline_local|ratio_local|ratio_tf32_local) max=100;; server_graphs|server_local|server_batch|ratio_ray|ratio_tf32_ray|vit_ratio_local) max=150;; vit_ratio_ray|validate|overhead) max=200;; *) max=150;;
  esac
  limit=$(( max < left - 10 ? max : left - 10 ))
  if [ "$limit" -lt 20 ]; then echo "=== SKIP $name (${left}s left)" | tee -a "$log"; continue; fi
  echo "=== $name start $(date -u +%T), limit ${limit}s" | tee -a "$log"
  s=$(date +%s)
  timeout -k 10 "$limit" bash "$0" step "$name" >> "$log" 2>&1
  echo "=== $name rc=$? in $(( $(date +%s) - s ))s" | tee -a "$log"
  tail -n 3 "$log" | grep -h '"raybench"' | cut -c1-300
  tar czf "$out/runs.tar.gz" --exclude='*.html' --exclude='*.trace.json' runs
done
