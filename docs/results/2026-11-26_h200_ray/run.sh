#!/usr/bin/env bash
# Issue 44's device run on the lent GPU, from the project root, with `.gpu/s` carried (Ray 2.60
# and what the GPU image lacks, rasterio included, as one xz archive for Python 3.12):
#   bash docs/results/2026-11-26_h200_ray/run.sh DEADLINE_S STEP...
# runs the steps in order while DEADLINE_S seconds last (a step that would start with under 20 s
# left is skipped and said so), each under its own time limit. Every step's run directory goes
# under runs/; after each step runs/ is packed into $OUT/runs.tar.gz (no pages or traces) and
# the log is $OUT/log.txt, so what ran comes back even when a later step fails or the call's
# limit cuts it. A second call on the same machine finds /tmp/site unpacked and reuses it.
set -u
here=docs/results/2026-11-26_h200_ray
sw=${SWEEPS:-$here/sweeps}
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
    resnet_ray) $py -m raybench.sweep $sw/resnet50.yaml --output runs/resnet50_ray ;;
    resnet_local) $py -m raybench.sweep $sw/resnet50.yaml --runner local --output runs/resnet50_local ;;
    vit_ray) $py -m raybench.sweep $sw/vit_tiles.yaml --output runs/vit_ray ;;
    vit_local) $py -m raybench.sweep $sw/vit_tiles.yaml --runner local --output runs/vit_local ;;
    knobs_ray) $py -m raybench.sweep $sw/resnet50_knobs.yaml --output runs/knobs_ray ;;
    shared_ray)  # two ranks on the one GPU (half a GPU each, gloo): the multi-rank path on CUDA
      $py -m raybench.sweep $sw/resnet50.yaml --output runs/shared_ray \
        --set hardware.ranks_per_gpu=2 --set hardware.cpus_per_worker=6 --set 'grid={precision: [bf16], batch_size: [128]}' ;;
    shared_local)
      $py -m raybench.sweep $sw/resnet50.yaml --runner local --output runs/shared_local \
        --set hardware.ranks_per_gpu=2 --set hardware.cpus_per_worker=6 --set 'grid={precision: [bf16], batch_size: [128]}' ;;
    inference_ray) $py -m raybench.sweep $sw/inference.yaml --output runs/inference_ray ;;
    ratio_ray|ratio_local)  # Ray / in-process with three windows a trial (one window gave CVs of 8-23%)
      runner=ray; [ $1 = ratio_local ] && runner=local
      $py -m raybench.sweep $sw/resnet50.yaml --runner $runner --output runs/$1 \
        --set measure.repeats=3 --set 'grid={precision: [bf16], batch_size: [128, 256]}' ;;
    offline_ray)  # Offline alone: the replica's busy share with the input tasks on the spare CPUs
      $py -m raybench.sweep $sw/inference.yaml --output runs/offline_ray --set 'grid={scenario: [offline]}' ;;
    validate)  # issue 43 on the GPU: the v1 suite's verdict and the measured peaks
      $py -m raybench.validate --expect-gpus 1 --output runs/validate ;;
    xview3_ray) $py -m raybench.sweep $sw/xview3.yaml --output runs/xview3_ray ;;
    job)  # the design card's way: a Ray cluster started by hand, the sweep as a submitted job
      export RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$($py -c "import secrets; print(secrets.token_hex(16))")
      ray="$py -m ray.scripts.scripts"
      # a node told to stop drains first, 30 s by default, though nothing runs on it by then
      RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S=3 setsid $ray start --head --block --num-gpus=1 --port=6390 --dashboard-host=127.0.0.1 \
        --dashboard-port=8265 --include-dashboard=true --disable-usage-stats \
        --temp-dir=/tmp/rbjob & head=$!
      $py -c "import time, urllib.request
for _ in range(120):
    try: urllib.request.urlopen('http://127.0.0.1:8265/api/version', timeout=2); break
    except urllib.error.HTTPError: break  # it answers (token authentication asks for more)
    except OSError: time.sleep(0.5)"
      $ray job submit --address http://127.0.0.1:8265 --working-dir . \
        --runtime-env-json '{"excludes": ["/.gpu", "/runs", "/data", "/results", "/.git", "/.venv"]}' \
        -- $py -m raybench.sweep $sw/resnet50.yaml --output "$PWD/runs/job_ray" \
        --set 'grid={precision: [bf16], batch_size: [256]}'
      rc=$?
      # `ray start --block` drains and stops its own node on SIGTERM (sent to its whole group,
      # the GCS died first and the drain waited for it); then whatever is left of the group
      kill -TERM $head; timeout 40 tail --pid=$head -f /dev/null; kill -KILL -- -$head 2>/dev/null
      return $rc ;;
    *) echo "unknown step $1"; return 2 ;;
  esac
}

if [ "${1:-}" = step ]; then step "$2"; exit $?; fi

deadline=$1; shift
t0=$(date +%s)
if [ -z "${PY:-}" ] && [ ! -d /tmp/site/ray ]; then
  mkdir -p /tmp/site && tar xJf .gpu/s/site.tar.xz -C /tmp/site
  echo "=== unpacked in $(( $(date +%s) - t0 ))s" | tee -a "$log"
fi
[ -z "${PY:-}" ] && export PYTHONPATH=/tmp/site:$PWD
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
for name in "$@"; do
  left=$(( deadline - ($(date +%s) - t0) ))
  case $name in
    # Ray trials cost ~25-32 s each here beyond their windows (README.md): four need ~150 s
    facts) max=30;; job|offline_ray) max=100;; ratio_ray|ratio_local) max=150;; xview3_ray|validate) max=240;; resnet_ray|knobs_ray) max=200;; *) max=150;;
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
