"""One model replica: the workload built for serving on one device, timing each call.

The same object runs inside a Ray actor (server), a Ray Data actor pool (offline) and a thread of
the in-process runner; it imports no Ray. At start it builds the model in the trial's precision
and runs untimed warmup calls. When the trial sets an accuracy target it also checks accuracy,
outside the start-up time: for most workloads by computing the fp32 reference predictions of
the accuracy samples with a second copy of the same weights, after which each call returns its
predictions' agreement with the reference; for a workload with a task metric (the detector's
xView3 aggregate) by one untimed pass over the workload's validation set, scored by the
workload. Each call returns its own timing.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import socket
import time
from typing import Any

import numpy as np
import torch

from raybench import flops, workloads
from raybench.context import WorkerContext, check_env
from raybench.memory import peak_rss_mb, steady_heap
from raybench.sections import revalidated
from raybench.trials import TrialSpec

log = logging.getLogger(__name__)


class Replica:
    def __init__(self, trial: TrialSpec, index: int = 0,
                 device: torch.device | None = None, node: str | None = None,
                 logical_gpus: bool = False):
        start = time.perf_counter()
        check_env(trial.hardware.env)
        steady_heap()  # calls measure alike in a fresh actor and in a process that ran trials
        self.trial = trial
        t, inf = self.trial, self.trial.inference
        self.index, self.node = index, node or socket.gethostname()
        if device is None:  # under Ray the replica's one GPU is cuda:0 (CUDA_VISIBLE_DEVICES)
            gpu = t.hardware.use_gpu and not logical_gpus  # logical: a placement token only
            device = torch.device("cuda", 0) if gpu else torch.device("cpu")
        self.device = device
        self.cls = workloads.get(t.workload_name)
        self.reference: dict[int, np.ndarray] = {}
        self.score: dict[str, float] | None = None
        self.check_s = 0.0  # the accuracy check's time, kept out of the start-up time
        task_metric = inf.accuracy_target is not None and self.cls.accuracy_metric is not None
        if inf.accuracy_target is not None and not task_metric:
            began = time.perf_counter()
            self.reference = self._reference(np.arange(inf.accuracy_samples))
            self.check_s += time.perf_counter() - began
        self.workload = self._build(t.hardware)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        warm = np.arange(t.workload.batch_size)
        inputs = self.cls.serving_inputs(t.workload, warm)
        # counted before any capture: a graph's replay runs no operator the counter sees
        began = time.perf_counter()
        self.flops = self._count_flops(inputs, len(warm))
        count_s = time.perf_counter() - began  # like the check, not part of start-up
        if inf.cuda_graphs:  # the largest call: a batch, or a Server's joined queries
            self.workload.capture_serving(max(t.workload.batch_size,
                                              inf.query_samples * inf.max_batch_queries))
        self.warmup_s = []
        for _ in range(inf.warmup_batches):
            began = time.perf_counter()
            self.workload.serve(inputs)
            self.warmup_s.append(time.perf_counter() - began)
        for n in self._other_call_sizes():  # untimed: their first calls pay cuDNN's autotuning
            other = self.cls.serving_inputs(t.workload, np.arange(n))
            for _ in range(max(1, inf.warmup_batches)):
                self.workload.serve(other)
        if task_metric:
            began = time.perf_counter()
            self.score = self._task_score()
            self.check_s += time.perf_counter() - began
        self.setup_s = time.perf_counter() - start - self.check_s - count_s

    def _other_call_sizes(self) -> list[int]:
        """Sample counts of the calls the scenario will make besides a full batch: a Server's
        joined queries (1 to max_batch_queries of them), the Offline pass's short last batch.
        A new input shape's first call pays for cuDNN's autotuning (hardware.cudnn_benchmark):
        on the lent H200 an eager ResNet-50 replica warmed at 8 images only, taking 1 to 8
        queries a call (8 new shapes), averaged 197 ms a call over its Server search and met
        no rate; taking one query a call (one new shape) it averaged 7.0 ms."""
        inf, b = self.trial.inference, self.trial.workload.batch_size
        if inf.scenario == "server":
            sizes = {inf.query_samples * q for q in range(1, inf.max_batch_queries + 1)}
        else:
            sizes = {inf.samples % b} - {0}
        return sorted(sizes - {b})

    def _count_flops(self, inputs: dict[str, np.ndarray], samples: int) -> float | None:
        """Forward FLOPs per sample of one real call (any served model, data-dependent ones
        too); None for a model without counted ops (fixed_service) or one the counter fails on."""
        try:
            return flops.counted(lambda: self.workload.serve(inputs), samples)
        except Exception as e:  # MFU stays unknown, not wrong
            log.info("FLOP count unavailable (%s: %s)", type(e).__name__, e)
            return None

    def _build(self, hardware) -> workloads.Workload:
        ctx = WorkerContext.single(hardware, self.device)
        ctx.set_math_mode()
        workload = self.cls(self.trial.workload, ctx)
        workload.setup_serving()
        return workload

    def _reference(self, ids: np.ndarray) -> dict[int, np.ndarray]:
        """Predictions of the same weights in IEEE fp32 (no compile) on the same inputs."""
        hw = revalidated(self.trial.hardware, precision="fp32", compile=False)
        ref = self._build(hw)
        out: dict[int, np.ndarray] = {}
        b = self.trial.workload.batch_size
        for lo in range(0, len(ids), b):
            chunk = ids[lo:lo + b]
            pred = ref.serve(self.cls.serving_inputs(self.trial.workload, chunk))["pred"]
            out.update({int(i): p for i, p in zip(chunk, pred, strict=True)})
        del ref
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return out

    def _task_score(self) -> dict[str, float]:
        """The workload's own scores of its validation set, in the trial's precision."""
        ids = self.cls.serving_validation_ids(self.trial.workload)
        b = self.trial.workload.batch_size
        preds: dict[int, Any] = {}
        for lo in range(0, len(ids), b):
            chunk = ids[lo:lo + b]
            out = self.workload.serve(self.cls.serving_inputs(self.trial.workload, chunk))
            preds.update({int(i): p for i, p in zip(chunk, out["pred"], strict=True)})
        return self.workload.serving_score(preds)

    def serve(self, ids: np.ndarray, inputs: dict[str, np.ndarray] | None = None,
              check: bool = True) -> dict[str, Any]:
        """One timed call: the forward of these samples, plus their agreement counts (where
        `check` and the reference has them)."""
        if inputs is None:
            inputs = self.cls.serving_inputs(self.trial.workload, ids)
        wall = time.time()
        began = time.perf_counter()
        out = self.workload.serve(inputs)
        service_s = time.perf_counter() - began
        matches = compared = 0
        for i, pred in zip(ids, out["pred"], strict=True):
            ref = self.reference.get(int(i)) if check else None
            if ref is not None:
                matches += int(np.sum(np.asarray(pred) == ref))
                compared += int(np.asarray(ref).size)
        return {
            "replica": self.index, "node": self.node, "pid": os.getpid(), "n": len(ids),
            "t_start": wall, "t_end": wall + service_s, "service_s": service_s,
            "first_token_s": out.get("first_token_s"), "tokens": out.get("tokens"),
            "prompt_tokens": out.get("prompt_tokens"),
            "matches": matches, "compared": compared,
        }

    def serve_queries(self, ids: np.ndarray, *inputs: dict[str, np.ndarray]) -> dict[str, Any]:
        """One timed call answering several queries at once (the Server's dynamic batching):
        their inputs joined into one batch (no copy for a single query)."""
        joined = inputs[0] if len(inputs) == 1 else {
            k: np.concatenate([x[k] for x in inputs]) for k in inputs[0]}
        return self.serve(ids, joined)

    def stats(self) -> dict[str, Any]:
        """Start-up and memory facts of this replica."""
        cuda = self.device.type == "cuda"
        return {
            "replica": self.index, "node": self.node, "setup_s": self.setup_s,
            # the fastest warmup call: the first pays for lazy CUDA/cuDNN start-up (seconds on
            # an H100), and a median of two is their mean
            "warmup_service_s": float(np.min(self.warmup_s)) if self.warmup_s else None,
            "device_name": torch.cuda.get_device_name(self.device) if cuda else "cpu",
            "peak_allocated_mb": torch.cuda.max_memory_allocated(self.device) / 2**20
            if cuda else None,
            "rss_peak_mb": peak_rss_mb(),
            "flops_per_sample": self.flops,
            "accuracy_check_s": self.check_s,
            # JSON: these facts travel as Ray Data columns, where a dict is no plain value
            "score": json.dumps(self.score) if self.score is not None else None,
        }


def local_devices(trial: TrialSpec) -> list[torch.device]:
    """The devices of a trial's replicas in this process: a GPU each, or the CPU."""
    n = trial.inference.replicas
    if not trial.hardware.use_gpu:
        return [torch.device("cpu")] * n
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if n > have:
        raise RuntimeError(f"infeasible: {n} GPU replicas asked but this machine has {have} "
                           "GPUs")
    return [torch.device("cuda", i) for i in range(n)]
