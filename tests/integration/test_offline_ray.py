"""The Offline pass on Ray Data keeps its replica busy, side by side with the same pass
in-process: replicas of a known service time (fixed_service), on an embedded Ray of two CPUs."""

from __future__ import annotations

import itertools
import warnings

import pytest
import ray

from raybench.grid import expand
from raybench.scenarios import offline
from raybench.spec import validate_sweep

pytestmark = pytest.mark.ray

# 128 calls of 26 ms (ResNet-50's batch of 256 on the lent H100), 8 samples each
SWEEP = {"name": "offline_ray", "system": {"label": "cpu"},
         "workload": {"name": "fixed_service", "service_ms": 26.0, "batch_size": 8},
         "hardware": {"cpus_per_worker": 0.5},
         "inference": {"scenario": "offline", "replicas": 1, "samples": 1024}}


@pytest.fixture(scope="module")
def embedded_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    yield
    ray.shutdown()


class _Echo:
    def __call__(self, batch):
        return batch


def test_the_replica_pool_is_asked_of_this_ray_in_its_own_terms(embedded_ray):
    """Ray 2.60 takes the actor's concurrency as the pool's `max_concurrent_calls_per_actor`
    and warns that Ray's actor option `max_concurrency` among map_batches' remote args goes in
    2.64; Ray 2.55 knows only the latter (`make test-ray-oldest` runs this). Either way: a pool
    of the replicas, four tasks sent to each ahead, two at once in it, and no warning."""
    options = offline.replica_pool(3)
    pool = options["compute"]
    assert (pool.min_size, pool.max_size, pool.max_tasks_in_flight_per_actor) == (3, 3, 4)
    assert (getattr(pool, "max_concurrent_calls_per_actor", None)
            or options.get("max_concurrency")) == 2
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*ray_remote_args.*")
        ray.data.range(4).map_batches(_Echo, batch_size=1, **options)  # planned, not run


@pytest.mark.serial  # a busy share and a rate against the same pass in-process: alone
def test_the_replica_is_kept_busy_through_ray_data(embedded_ray):
    """With one call per Ray Data task and Ray Data's defaults, this replica sat 12.9-16.4 ms
    idle between its calls of 26 ms, 60.7-64.5% busy, at 0.61-0.65 of the in-process pass's
    rate (ResNet-50's replica on the lent H100: 71% busy); sent as eight tasks of 16 calls,
    four ahead and two at once in the actor, 95.6-95.9% busy at 0.94-0.96 (2-core VM)."""
    trial = expand(validate_sweep(SWEEP))[0]
    calls, stats = offline.run_ray(trial, start_timeout_s=60)
    on_ray = offline.summarize(calls, stats, trial)
    local = offline.summarize(*offline.run_local(trial, [None]), trial)
    figures = {k: (round(on_ray[k], 2), round(local[k], 2)) for k in
               ("infer/busy_pct", "infer/replica_wait_p50_ms", "infer/samples_per_s")}
    print(figures)
    assert on_ray["infer/samples"] == local["infer/samples"] == 1024
    assert on_ray["infer/replica_wait_p50_ms"] < 5.0, figures
    assert on_ray["infer/busy_pct"] >= 80.0, figures
    assert on_ray["infer/samples_per_s"] >= 0.8 * local["infer/samples_per_s"], figures
    # one call at a time in the replica, each once: Ray Data's second task in the actor
    # overlaps its bookkeeping with a call, never two calls
    spans = sorted((r["t_start"], r["t_end"]) for r in calls)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


@pytest.mark.serial  # rates of a known service time: alone, on the Ray started above
def test_loadgen_drives_replica_actors(embedded_ray, tmp_path):
    """MLPerf's LoadGen with a replica actor as its system under test: its Server run at a
    fixed rate (no search), a row with LoadGen's figures and its logs in the trial's folder,
    the replica answering every query LoadGen sent (LoadGen's Offline, and the run against
    raybench's own, in-process: tests/scenarios/test_loadgen.py)."""
    pytest.importorskip("mlperf_loadgen")
    from raybench.scenarios.run import run_trial

    (trial,) = expand(validate_sweep({**SWEEP, "workload": {
        "name": "fixed_service", "service_ms": 5.0}, "inference": {
        "scenario": "server", "rate_qps": 50.0, "latency_bound_ms": 100.0, "probe_seconds": 1.0,
        "min_queries": 50, "loadgen": True, "loadgen_seconds": 2.0,
        "early_stopping": False}}))  # 50 queries: the percentile alone lets LoadGen run
    out = run_trial(trial, "ray", 60.0, artifacts=str(tmp_path))
    assert out.status == "ok", out.error
    m = out.metrics
    print({k: v for k, v in m.items() if k.startswith("loadgen/")})
    assert (tmp_path / "loadgen" / "mlperf_log_summary.txt").exists()
    assert m["loadgen/log_dir"] == str(tmp_path / "loadgen")
    # 2 s at 50 queries/s: about 100 queries, each 5 ms, far under 100 ms
    assert m["loadgen/scenario"] == "Server" and m["loadgen/target_qps"] == 50.0
    assert m["loadgen/scheduled_samples_per_s"] == pytest.approx(50.0, rel=0.25)
    assert m["loadgen/queries"] >= 50 and 5.0 <= m["loadgen/p50_ms"] < 100.0
    assert m["server/rate_qps"] == 50.0  # raybench's own run at that rate passed first
