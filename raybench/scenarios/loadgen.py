"""MLPerf's official LoadGen as the load (`inference.loadgen: true`): raybench's replicas as its
system under test, its logs read back into row columns.

Owns the SUT (LoadGen's queries wait in one FIFO queue and go to whichever replica is free, up
to `max_batch` waiting queries a call: scenarios/dispatch.py, as in raybench's own Server
run, with LoadGen choosing when each query arrives), LoadGen's settings from the sweep, a
watchdog that answers the outstanding queries of a replica that stopped answering (LoadGen
waits for every query and has no time limit of its own), and the reading of a LoadGen log
directory (`read_log`, `columns`), which `raybench import` uses too.

Sources (mlcommons/inference, `loadgen/`): the Python API of `bindings/python_api.cc`
(ConstructSUT, ConstructQSL, StartTestWithLogSettings, QuerySamplesComplete), the settings of
`test_settings.h`, the log keys of `results.cc` (`result_validity`, `early_stopping_met`,
`result_<p>_percentile_latency_ns`, ...). Checked with mlcommons-loadgen 6.0.17.
"""

from __future__ import annotations

import abc
import asyncio
import json
import math
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from raybench.columns import Metric, declare
from raybench.failures import Infeasible
from raybench.scenarios import dispatch
from raybench.scenarios.dispatch import Serve

DETAIL = "mlperf_log_detail.txt"
SUMMARY = "mlperf_log_summary.txt"
# A replica that has answered nothing for this long has stopped: its queries are answered
# for it so that LoadGen ends, and the trial is an error row.
STALL_S = 120.0
# Offline sends 1.1 x expected QPS x min duration samples at once, so a system more than 10%
# faster than it was expected to be ends before the minimum duration and LoadGen calls the run
# INVALID ("Increase expected QPS", its summary says). The expected rate comes from a warmup
# (or, for LLM engines, a run just measured), which a neighbour's burst can slow: a clean
# clone's make test once got INVALID on two 5 ms replicas. Such a run is made again, once, at
# this much over the rate it measured, as a submitter would.
OFFLINE_RERUN_HEADROOM = 1.1

declare(
    Metric("loadgen/validity", "text", "LoadGen's verdict on its run (VALID / INVALID)"),
    Metric("loadgen/valid", "bool", "LoadGen called its run VALID"),
    Metric("loadgen/scenario", "text", "LoadGen's scenario (Server, Offline)"),
    Metric("loadgen/target_qps", "queries/s", "the rate LoadGen was asked for (Server: the "
           "search's rate or rate_qps; Offline: the expected rate)"),
    Metric("loadgen/scheduled_samples_per_s", "samples/s", "Server: the rate LoadGen "
           "scheduled"),
    Metric("loadgen/samples_per_s", "samples/s", "Server: completed samples/s; Offline: "
           "LoadGen's result"),
    Metric("loadgen/p{q}_ms", "ms", "LoadGen's latency percentile"),
    Metric("loadgen/ttft_p{q}_ms", "ms", "token mode: LoadGen's time to first token, percentile"),
    Metric("loadgen/tpot_p{q}_ms", "ms", "token mode: LoadGen's time per output token, "
           "percentile"),
    Metric("loadgen/output_tokens_per_s", "tokens/s", "token mode: LoadGen's completed output "
           "tokens per second"),
    Metric("loadgen/queries", "count", "queries LoadGen sent"),
    Metric("loadgen/late", "count", "queries over the latency bound (LoadGen's count)"),
    Metric("loadgen/early_stopping_met", "bool", "LoadGen's early stopping certified the "
           "percentile"),
    Metric("loadgen/perf_constraints_met", "bool", "LoadGen's latency constraint met"),
    Metric("loadgen/min_duration_met", "bool", "the run lasted the minimum duration asked"),
    Metric("loadgen/min_queries_met", "bool", "the run sent the minimum query count asked"),
    Metric("loadgen/min_duration_s", "s", "the minimum duration asked (MLPerf's: 600 s)"),
    Metric("loadgen/duration_s", "s", "LoadGen's run, its first query to its last answer"),
    Metric("loadgen/version", "text", "LoadGen's version"),
    Metric("loadgen/log_dir", "text", "LoadGen's logs (summary, detail) of this trial"),
    Metric("loadgen/reruns", "count", "Offline: 1 where the first run ended under the minimum "
           "duration (expected QPS too low) and LoadGen ran again at the rate it measured; "
           "the row is the second run's"),
)


def load_module() -> Any:
    try:
        import mlperf_loadgen  # optional: raybench[mlperf]
    except ImportError as e:
        raise Infeasible(
            "inference.loadgen needs MLPerf's LoadGen, which is not installed "
            f"({e}). Fix: pip install 'raybench[mlperf]' (the mlcommons-loadgen package), or "
            "set inference.loadgen: false") from e
    return mlperf_loadgen


class _Sut(abc.ABC):
    """What both SUTs share: an event loop in a thread of its own (the token engines' streams
    are read there; Dispatch's replica threads start and stop from it), LoadGen's `issue` on
    its issuing thread only handing the samples over, the outstanding samples under a lock,
    and a watchdog that answers them all once nothing was answered for `stall_s`.
    A subclass keeps `pending` (key -> LoadGen's id) and says how a key is answered."""

    def __init__(self, lg: Any, stall_s: float | None = None):
        self.lg = lg
        self.stall_s = STALL_S if stall_s is None else stall_s
        self.errors: list[BaseException] = []
        self.pending: dict[Any, Any] = {}
        self.last_answer = time.monotonic()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="raybench-loadgen-sut")
        self._watch = threading.Thread(target=self._watchdog, daemon=True,
                                       name="raybench-loadgen-watchdog")

    def __enter__(self) -> _Sut:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._begin(), self.loop).result()
        self._watch.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        asyncio.run_coroutine_threadsafe(self._close(), self.loop).result(timeout=90)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=30)
        self._watch.join(timeout=30)

    @abc.abstractmethod
    async def _begin(self) -> None:
        """The subclass's coroutines, started on the loop."""

    async def _end(self) -> None:  # noqa: B027 (a hook: an SUT with nothing of its own to end)
        """The subclass's own end, before what is left on the loop is cancelled."""

    async def _close(self) -> None:
        await self._end()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def flush(self) -> None:  # noqa: B027 (LoadGen's callback, which both SUTs answer so)
        """LoadGen's FlushQueries: nothing is held back to flush."""

    @abc.abstractmethod
    def issue(self, samples: list[Any]) -> None:
        """LoadGen's IssueQuery, on its issuing thread: hand the samples over, return at once."""

    def _hand_over(self, items: list[tuple[int, int]], pending: dict[Any, Any]) -> None:
        """LoadGen's IssueQuery: these samples outstanding (the watchdog's clock starts with
        the first), then handed to the subclass."""
        with self._lock:
            if not self.pending:
                self.last_answer = time.monotonic()
            self.pending.update(pending)
        self._take(items)

    @abc.abstractmethod
    def _take(self, items: list[tuple[int, int]]) -> None:
        """On LoadGen's issuing thread: start work on these (LoadGen's id, sample index)
        items, returning at once."""

    def _answered(self, keys: list[Any]) -> list[Any]:
        """LoadGen's ids of these keys, no longer outstanding (a key answered before: none)."""
        with self._lock:
            ids = [q for q in (self.pending.pop(k, None) for k in keys) if q is not None]
            self.last_answer = time.monotonic()
        return ids

    @abc.abstractmethod
    def _answer(self, keys: list[Any]) -> None:
        """Answer these keys to LoadGen, whatever they are (the watchdog's end of them)."""

    def _watchdog(self) -> None:
        while not self._done.wait(1.0):
            with self._lock:
                stalled = bool(self.pending) and (
                    time.monotonic() - self.last_answer > self.stall_s)
                keys = list(self.pending) if stalled else []
            if keys:
                self.errors.append(TimeoutError(
                    f"the replicas answered no query for {self.stall_s:.0f} s with {len(keys)} "
                    "of LoadGen's queries waiting: they were answered for them so that "
                    "LoadGen could end"))
                self._answer(keys)


class Dispatch(_Sut):
    """LoadGen's SUT over replica calls: raybench's own dispatch (dispatch.Fifo), a thread per
    replica taking the oldest waiting query (and up to max_batch - 1 more already waiting) in
    one call, each call's queries answered to LoadGen as it ends."""

    def __init__(self, lg: Any, calls: Sequence[Serve], max_batch: int,
                 stall_s: float | None = None):
        super().__init__(lg, stall_s)
        self.records: list[dict[str, Any]] = []
        self.issued: list[float] = []  # perf_counter at each query's receipt
        self.fifo = dispatch.Fifo(calls, max_batch, self._call_ended,
                                  index_of=lambda item: item[1])

    async def _begin(self) -> None:
        self.fifo.__enter__()

    async def _end(self) -> None:
        # LoadGen has ended: every query answered, by its replica or by the watchdog (whose
        # stuck replica's thread, a daemon, is not waited for long)
        await asyncio.get_running_loop().run_in_executor(
            None, self.fifo.stop, 0.5 if self.errors else 5.0)

    def issue(self, samples: list[Any]) -> None:
        self.issued.extend([time.perf_counter()] * len(samples))
        items = [(s.id, s.index) for s in samples]
        self._hand_over(items, {qid: qid for qid, _ in items})

    def _take(self, items: list[tuple[int, int]]) -> None:
        for item in items:
            self.fifo.put(item)

    def _call_ended(self, call: dispatch.CallEnd) -> None:
        # answered even when the call failed, so that LoadGen ends; the trial is an error
        if call.error is not None:
            self.errors.append(call.error)
        else:
            self.records.append(call.record)
        self._answer([qid for qid, _ in call.items])

    def _answer(self, keys: list[Any]) -> None:
        ids = self._answered(keys)
        if ids:
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(q, 0, 0) for q in ids])


class TokenDispatch(_Sut):
    """LoadGen's SUT over token engines (scenarios/llm/load.Replica), for its token-latency
    mode: each sample a request of its lengths to the replica with the fewest in flight; its
    first token told to LoadGen as it arrives (FirstTokenComplete), its end with its output
    token count (QuerySamplesComplete), from which LoadGen takes TTFT and TPOT."""

    def __init__(self, lg: Any, replicas: Sequence[Any], sizes: Any,
                 prompt: Callable[[int, int], list[int]], stall_s: float | None = None):
        super().__init__(lg, stall_s)
        self.replicas, self.sizes, self.prompt = list(replicas), sizes, prompt
        self.inflight = [0] * len(self.replicas)
        self.replica_of: dict[str, int] = {}  # request id -> its replica (loop thread only)
        self.first_seen: set[str] = set()  # requests whose first token LoadGen has (loop)

    async def _begin(self) -> None:
        self._listeners = [asyncio.ensure_future(self._listen(i))
                           for i in range(len(self.replicas))]

    async def _end(self) -> None:
        await asyncio.gather(*(r.end() for r in self.replicas), return_exceptions=True)
        for result in await asyncio.gather(*self._listeners, return_exceptions=True):
            if isinstance(result, Exception):  # a broken stream: its requests answered already
                self.errors.append(result)

    def issue(self, samples: list[Any]) -> None:
        items = [(s.id, s.index) for s in samples]
        self._hand_over(items, {f"lg-{qid}": qid for qid, _ in items})

    def _take(self, items: list[tuple[int, int]]) -> None:
        self.loop.call_soon_threadsafe(self._route, items)

    def _route(self, items: list[tuple[int, int]]) -> None:
        """On the loop: each sample to the replica with the fewest in flight."""
        for qid, index in items:
            i = min(range(len(self.replicas)), key=lambda j: self.inflight[j])
            self.inflight[i] += 1
            rid = f"lg-{qid}"
            self.replica_of[rid] = i
            n_in, n_out = (int(x) for x in self.sizes[index % len(self.sizes)])
            asyncio.ensure_future(self._submit(i, rid, self.prompt(index, n_in), n_out))

    async def _submit(self, i: int, rid: str, prompt: list[int], n_out: int) -> None:
        try:
            await self.replicas[i].submit(rid, prompt, n_out)
        except Exception as e:  # answered, so that LoadGen ends; the trial is an error
            self.errors.append(e)
            self._finish(rid, 0)

    async def _listen(self, i: int) -> None:
        async for batch in self.replicas[i].events():
            for rid, count, _stamp, finished, _ids in batch:
                if count < 0:
                    self.errors.append(RuntimeError(f"the engine failed request {rid}"))
                    self._finish(rid, 0)
                    continue
                if count > 0 and rid not in self.first_seen:
                    self.first_seen.add(rid)
                    with self._lock:
                        qid = self.pending.get(rid)
                    if qid is not None:
                        self.lg.FirstTokenComplete([self.lg.QuerySampleResponse(qid, 0, 0, 1)])
                if finished:
                    self._finish(rid, count)

    def _finish(self, rid: str, tokens: int) -> None:
        for qid in self._answered([rid]):
            self.inflight[self.replica_of.pop(rid)] -= 1
            self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(qid, 0, 0, tokens)])

    def _answer(self, keys: list[Any]) -> None:
        for rid in keys:  # the watchdog's thread: the in-flight counts no longer matter
            for qid in self._answered([rid]):
                self.lg.QuerySamplesComplete([self.lg.QuerySampleResponse(qid, 0, 0, 0)])


def run(calls: Sequence[Serve], inf: Any, scenario: str, target_qps: float, out_dir: Path,
        max_batch: int, samples: int, min_queries: int | None = None) -> dict[str, Any]:
    """One LoadGen run over the replicas' calls; its log read back (`read_log`), the replica
    records it collected under `records`, each query's receipt time (perf_counter) under
    `issued_s`. A replica error raises after LoadGen has ended.
    `min_queries`: LoadGen's minimum query count where more than inf.min_queries (the
    certifying runs' count, when it confirms a certified rate)."""
    lg = load_module()

    def start(qps: float) -> dict[str, Any]:
        sut = Dispatch(lg, calls, max_batch)
        test = settings(lg, inf, scenario, qps, min_queries=min_queries)
        return {**_drive(lg, sut, samples, test, out_dir), "records": sut.records,
                "issued_s": sut.issued}
    return _long_enough(start, scenario, target_qps)


def run_tokens(replicas: Sequence[Any], inf: Any, scenario: str, target_qps: float,
               out_dir: Path, sizes: Any, prompt: Callable[[int, int], list[int]],
               min_queries: int | None = None) -> dict[str, Any]:
    """One LoadGen run in its token-latency mode over LLM engine replicas (sample k asks for
    sizes[k]'s lengths); its log read back. An engine error raises after LoadGen ended.
    `min_queries` as for `run`."""
    lg = load_module()

    def start(qps: float) -> dict[str, Any]:
        test = settings(lg, inf, scenario, qps, tokens=True, min_queries=min_queries)
        return _drive(lg, TokenDispatch(lg, replicas, sizes, prompt), len(sizes), test,
                      out_dir)
    return _long_enough(start, scenario, target_qps)


def _long_enough(start: Callable[[float], dict[str, Any]], scenario: str,
                 target_qps: float) -> dict[str, Any]:
    """`start(target_qps)`; an Offline run that ended under its minimum duration (and only
    for that) made again at OFFLINE_RERUN_HEADROOM over the rate it measured, its log kept
    (LoadGen writes the same files again). `raybench_reruns` says which it was (Offline only:
    a Server run's rate is the trial's to choose)."""
    log = start(target_qps)
    if scenario != "offline":
        return log
    rate = log.get("result_samples_per_second")
    if (log.get("result_min_duration_met") is False
            and log.get("result_min_queries_met") is not False
            and isinstance(rate, int | float) and rate > 0):
        return {**start(rate * OFFLINE_RERUN_HEADROOM), "raybench_reruns": 1}
    return {**log, "raybench_reruns": 0}


def _drive(lg: Any, sut: _Sut, samples: int, test_settings: Any, out_dir: Path
           ) -> dict[str, Any]:
    """LoadGen's test with this SUT over a sample library of `samples` (nothing to load: the
    replicas make their inputs), its logs in `out_dir`, read back; the SUT's first error
    raised once LoadGen has ended."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with sut:
        handle = lg.ConstructSUT(sut.issue, sut.flush)
        qsl = lg.ConstructQSL(samples, samples, lambda _: None, lambda _: None)
        try:
            lg.StartTestWithLogSettings(handle, qsl, test_settings, _log_settings(lg, out_dir))
        finally:
            lg.DestroyQSL(qsl)
            lg.DestroySUT(handle)
    if sut.errors:
        raise sut.errors[0]
    return read_log(out_dir)


def log_folder(trial_key: str, artifacts: str | None) -> tuple[Path, str | None]:
    """Where LoadGen's logs go, and what the row says of it: the trial's folder, or (no
    folder: a bare run_trial) a new temporary one, not named in the row."""
    if artifacts:
        folder = Path(artifacts) / "loadgen"
        return folder, str(folder)
    return Path(tempfile.mkdtemp(prefix=f"raybench-loadgen-{trial_key}-")), None


def _log_settings(lg: Any, out_dir: Path) -> Any:
    output = lg.LogOutputSettings()
    output.outdir = str(out_dir)
    output.copy_summary_to_stdout = False
    log_settings = lg.LogSettings()
    log_settings.log_output = output
    log_settings.enable_trace = False  # a trace of every query: megabytes, read by no one here
    return log_settings


def settings(lg: Any, inf: Any, scenario: str, target_qps: float, tokens: bool = False,
             min_queries: int | None = None) -> Any:
    """LoadGen's TestSettings from the trial's `inference` section; `tokens` (a token
    workload): LoadGen's token-latency mode, judging ttft_bound_ms and tpot_bound_ms;
    `min_queries`: a minimum query count above inf.min_queries."""
    s = lg.TestSettings()
    s.mode = lg.TestMode.PerformanceOnly
    if tokens:
        s.use_token_latencies = True
        big = 3_600_000  # ms: a bound not set is not judged
        s.ttft_latency = int((inf.ttft_bound_ms or big) * 1e6)
        s.tpot_latency = int((inf.tpot_bound_ms or big) * 1e6)
    if scenario == "server":
        s.scenario = lg.TestScenario.Server
        s.server_target_qps = target_qps
        s.server_target_latency_ns = int((inf.latency_bound_ms or inf.ttft_bound_ms
                                          or 3_600_000) * 1e6)
        s.server_target_latency_percentile = inf.latency_percentile / 100.0
    else:
        s.scenario = lg.TestScenario.Offline
        s.offline_expected_qps = target_qps
    s.min_duration_ms = int(inf.loadgen_seconds * 1000)
    s.min_query_count = max(inf.min_queries, min_queries or 0)
    s.qsl_rng_seed = s.sample_index_rng_seed = s.schedule_rng_seed = inf.seed
    return s


def read_log(folder: Path) -> dict[str, Any]:
    """The `:::MLLOG` lines of a LoadGen `mlperf_log_detail.txt`, key -> value (a key logged
    twice keeps its last value). A folder without one raises FileNotFoundError."""
    out: dict[str, Any] = {}
    with open(Path(folder) / DETAIL, encoding="utf-8", errors="replace") as f:
        for line in f:
            _, marker, payload = line.partition(":::MLLOG")
            if not marker:
                continue
            try:
                entry = json.loads(payload)
            except json.JSONDecodeError:
                continue  # a line cut by a run that died: the rest still read
            if isinstance(entry, dict) and "key" in entry:
                out[entry["key"]] = entry.get("value")
    if not out:
        raise ValueError(f"{Path(folder) / DETAIL} holds no :::MLLOG line")
    return out


def columns(log: dict[str, Any], log_dir: str | None = None) -> dict[str, Any]:
    """Row columns (`loadgen/*`) of one LoadGen run's log (pure)."""
    def num(key: str) -> float | None:
        v = log.get(key)
        return float(v) if isinstance(v, int | float) and math.isfinite(v) else None

    def ms(key: str) -> float | None:
        v = num(key)
        return None if v is None else v / 1e6

    scenario = log.get("effective_scenario") or log.get("requested_scenario")
    offline = scenario == "Offline"
    validity = log.get("result_validity")
    out: dict[str, Any] = {
        "loadgen/validity": validity,
        "loadgen/valid": None if validity is None else validity == "VALID",
        "loadgen/scenario": scenario,
        "loadgen/target_qps": num("effective_target_qps"),
        "loadgen/scheduled_samples_per_s": None if offline else num(
            "result_scheduled_samples_per_sec"),
        "loadgen/samples_per_s": num("result_samples_per_second") if offline else num(
            "result_completed_samples_per_sec"),
        "loadgen/queries": num("result_query_count"),
        "loadgen/late": num("result_overlatency_query_count"),
        "loadgen/early_stopping_met": log.get("early_stopping_met"),
        "loadgen/perf_constraints_met": log.get("result_perf_constraints_met"),
        "loadgen/min_duration_met": log.get("result_min_duration_met"),
        "loadgen/min_queries_met": log.get("result_min_queries_met"),
        "loadgen/min_duration_s": None if num("effective_min_duration_ms") is None else
        num("effective_min_duration_ms") / 1e3,
        "loadgen/duration_s": _duration_s(log),
        "loadgen/version": log.get("loadgen_version"),
        "loadgen/log_dir": log_dir,
        # None: a Server run, or a log raybench did not run (`raybench import`)
        "loadgen/reruns": log.get("raybench_reruns"),
    }
    for q in (50, 90, 99):
        out[f"loadgen/p{q}_ms"] = ms(f"result_{q:.2f}_percentile_latency_ns")
    if log.get("requested_use_token_latencies") or log.get("effective_use_token_latencies"):
        for q in (50, 99):
            out[f"loadgen/ttft_p{q}_ms"] = ms(f"result_first_token_{q:.2f}_percentile_latency_ns")
            out[f"loadgen/tpot_p{q}_ms"] = ms(f"result_time_per_output_token_{q:.2f}_percentile_ns")
        out["loadgen/output_tokens_per_s"] = num("result_completed_tokens_per_second") \
            if num("result_completed_tokens_per_second") is not None else num(
                "result_tokens_per_second")
    return out


def _duration_s(log: dict[str, Any]) -> float | None:
    """LoadGen's samples over its completed rate (it logs no duration of its own)."""
    n = log.get("result_query_count")
    rate = log.get("result_completed_samples_per_sec", log.get("result_samples_per_second"))
    spq = log.get("effective_samples_per_query") or 1
    if isinstance(n, int | float) and isinstance(rate, int | float) and rate > 0:
        return float(n * spq / rate)
    return None
