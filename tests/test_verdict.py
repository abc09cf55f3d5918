"""raybench.validate.verdict on fabricated NVML facts and probe rows: each fault gives its warn or fail
with its reason, a healthy machine passes, and the margins file is checked like a sweep."""

from __future__ import annotations

import copy
import json
import os

import pandas as pd
import pytest

from raybench.validate.verdict import Margins, MarginsError, judge, load_margins
from tests.conftest import ROOT

HEALTHY = {"ecc_uncorrected_volatile": 0, "ecc_uncorrected_aggregate": 0, "retired_pages": 0,
           "retired_pages_pending": False, "remapped_rows_uncorrected": 0,
           "remap_pending": False, "remap_failed": False, "sm_clock_mhz": 345,
           "sm_clock_max_mhz": 1980, "throttle_reasons": ["gpu_idle"], "pcie_gen": 5,
           "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16, "persistence_mode": True,
           "power_limit_default_w": 700.0}
MODEL = "NVIDIA H100 80GB HBM3"


def node(n_gpus: int = 4, driver: str = "560.35.03", rdma=("mlx5_0",)) -> dict:
    return {"gpus": [{"index": i, "name": MODEL, "uuid": f"GPU-{i}", "driver": driver,
                      "power_limit_w": 700.0, "health": dict(HEALTHY)} for i in range(n_gpus)],
            "cuda": {"torch_cuda": "12.8", "nccl": "2.27.5"}, "rdma_devices": list(rdma)}


def probe_rows(ips: list[str], n_gpus: int, tflops: dict | None = None) -> pd.DataFrame:
    """A matmul and a membw row per GPU, healthy figures unless `tflops` says otherwise."""
    rows = []
    for ip in ips:
        for g in range(n_gpus):
            base = {"status": "ok", "device": MODEL, "hardware.precision": "bf16",
                    "perf/headline_metric": None, "perf/datasheet_metric": None,
                    "cluster/rank_nodes": ip, "cluster/rank_gpus": str(g),
                    "gpu/throttled": False, "gpu/sm_clock_mean_mhz": 1900.0}
            rows.append({**base, "workload.name": "matmul", "workload.size": 8192,
                         "perf/headline_metric": "probe/matmul_tflops",
                         "perf/datasheet_metric": "probe/matmul_datasheet_tflops",
                         "probe/matmul_tflops": (tflops or {}).get((ip, g), 700.0),
                         "probe/matmul_datasheet_tflops": 989.5})
            rows.append({**base, "workload.name": "membw", "workload.size_mb": 1024.0,
                         "perf/headline_metric": "probe/copy_gb_s",
                         "perf/datasheet_metric": "probe/memory_datasheet_gb_s",
                         "probe/copy_gb_s": 2900.0, "probe/memory_datasheet_gb_s": 3350.0})
    return pd.DataFrame(rows)


def by_subject(verdicts):
    return {v.subject: v for v in verdicts}


def test_a_healthy_machine_passes():
    gpus, nodes = judge({"10.0.0.1": node()}, probe_rows(["10.0.0.1"], 4), Margins(),
                        expect_gpus=4)
    assert [v.level for v in gpus + nodes] == ["pass"] * 5, [v.reasons for v in gpus + nodes]
    assert gpus[0].figures["probe/matmul_tflops"] == 700.0  # one precision: no label


def test_a_degraded_pcie_link_fails_and_a_slower_generation_warns():
    facts = node()
    facts["gpus"][2]["health"].update(pcie_width=8)
    facts["gpus"][3]["health"].update(pcie_gen=3)
    gpus = by_subject(judge({"10.0.0.1": facts}, probe_rows(["10.0.0.1"], 4), Margins())[0])
    assert gpus["10.0.0.1 GPU 2"].level == "fail"
    assert "x8, the card's is x16" in gpus["10.0.0.1 GPU 2"].reasons[0]
    assert gpus["10.0.0.1 GPU 3"].level == "warn" and "gen 3" in gpus["10.0.0.1 GPU 3"].reasons[0]


def test_ecc_errors_fail_since_the_driver_loaded_and_warn_over_the_devices_life():
    facts = node()
    facts["gpus"][0]["health"].update(ecc_uncorrected_volatile=2, ecc_uncorrected_aggregate=2)
    facts["gpus"][1]["health"].update(ecc_uncorrected_aggregate=1)
    facts["gpus"][3]["health"].update(retired_pages_pending=True)
    gpus = judge({"10.0.0.1": facts}, probe_rows(["10.0.0.1"], 4), Margins())[0]
    assert [(v.subject, v.level) for v in gpus] == [
        ("10.0.0.1 GPU 0", "fail"), ("10.0.0.1 GPU 3", "fail"), ("10.0.0.1 GPU 1", "warn"),
        ("10.0.0.1 GPU 2", "pass")]  # worst first
    assert "2 uncorrected ECC errors since the driver loaded" in gpus[0].reasons[0]
    assert "waits for a GPU reset" in gpus[1].reasons[0]


def test_a_gpu_12_percent_below_its_peers_warns_and_one_far_below_fails():
    rows = probe_rows(["10.0.0.1", "10.0.0.2"], 4,
                      tflops={("10.0.0.2", 1): 700.0 * 0.88, ("10.0.0.1", 3): 700.0 * 0.7})
    gpus = by_subject(judge({"10.0.0.1": node(), "10.0.0.2": node()}, rows, Margins())[0])
    slow = gpus["10.0.0.2 GPU 1"]
    assert slow.level == "warn" and "12% below the median of 8 like GPUs" in slow.reasons[0]
    assert slow.reasons[0].startswith("warn: probe/matmul_tflops 616:")
    assert gpus["10.0.0.1 GPU 3"].level == "fail"
    assert sum(v.level == "pass" for v in gpus.values()) == 6
    # and under a margin set wider, the 12% is within it
    wide = Margins(peer_warn_pct=15.0, peer_fail_pct=40.0)
    gpus = by_subject(judge({"10.0.0.1": node(), "10.0.0.2": node()}, rows, wide)[0])
    assert gpus["10.0.0.2 GPU 1"].level == "pass" and gpus["10.0.0.1 GPU 3"].level == "warn"


def test_a_probe_far_below_its_datasheet_fails():
    rows = probe_rows(["10.0.0.1"], 1, tflops={("10.0.0.1", 0): 300.0})
    (gpu,), _ = judge({"10.0.0.1": node(1)}, rows, Margins())
    assert gpu.level == "fail" and "30% of the datasheet's 989.5" in gpu.reasons[0]


def test_a_slowdown_or_a_held_clock_under_load():
    rows = probe_rows(["10.0.0.1"], 2)
    rows.loc[(rows["cluster/rank_gpus"] == "0"), "gpu/throttled"] = True
    rows.loc[(rows["cluster/rank_gpus"] == "1") & (rows["workload.name"] == "matmul"),
             "gpu/sm_clock_mean_mhz"] = 1200.0
    gpus = by_subject(judge({"10.0.0.1": node(2)}, rows, Margins())[0])
    assert gpus["10.0.0.1 GPU 0"].level == "fail"
    assert gpus["10.0.0.1 GPU 1"].level == "warn" and "61% of the card's 1980 MHz" in \
        gpus["10.0.0.1 GPU 1"].reasons[0]


def test_a_clock_the_power_cap_holds_down_passes():
    # the lent H200's validation (2026-11-26): bf16 and fp16 GEMMs at 1,473-1,577 MHz of 1,980,
    # sw_power_cap 95% of the window, at the default 700 W limit: a healthy card
    rows = probe_rows(["10.0.0.1"], 2)
    matmul = rows["workload.name"] == "matmul"
    rows["gpu/throttle_reasons"] = None
    rows.loc[matmul, "gpu/sm_clock_mean_mhz"] = 1473.0
    rows.loc[matmul & (rows["cluster/rank_gpus"] == "0"), "gpu/throttle_reasons"] = \
        "sw_power_cap"
    gpus = by_subject(judge({"10.0.0.1": node(2)}, rows, Margins())[0])
    assert gpus["10.0.0.1 GPU 0"].level == "pass", gpus["10.0.0.1 GPU 0"].reasons
    # the same clock with no power cap among the reasons (a clock lock, say) still warns
    assert gpus["10.0.0.1 GPU 1"].level == "warn" and "74% of the card's 1980 MHz" in \
        gpus["10.0.0.1 GPU 1"].reasons[0]
    # and a power limit set below its default is a health fault of its own
    low = node(2)
    low["gpus"][0]["health"] = {**low["gpus"][0]["health"], "power_limit_w": 500.0}
    low["gpus"][0]["power_limit_w"] = 500.0
    gpu0 = by_subject(judge({"10.0.0.1": low}, rows, Margins())[0])["10.0.0.1 GPU 0"]
    assert gpu0.level != "pass" and any("power limit" in r for r in gpu0.reasons), gpu0.reasons


def test_nccl_over_sockets_beside_an_rdma_device_fails_the_node():
    rows = pd.concat([probe_rows(["10.0.0.1", "10.0.0.2"], 1), pd.DataFrame([{
        "status": "ok", "workload.name": "allreduce", "perf/headline_metric": None,
        "cluster/rank_nodes": "10.0.0.1,10.0.0.2",
        "cluster/rank_gpus": "0,0", "cluster/nccl_net": "Socket"}])])
    facts = {"10.0.0.1": node(1), "10.0.0.2": node(1, rdma=())}
    nodes = by_subject(judge(facts, rows, Margins())[1])
    assert nodes["node 10.0.0.1"].level == "fail"
    assert "sockets between nodes though this node has RDMA devices (mlx5_0)" in \
        nodes["node 10.0.0.1"].reasons[0]
    assert nodes["node 10.0.0.2"].level == "pass"  # no RDMA device: sockets are all it has


def test_a_trial_that_never_started_is_no_traceback(tmp_path):
    """An all-reduce trial whose workers did not start has no cluster/rank_nodes: read back
    from Parquet (pandas 3) the cell stays missing through astype(str), and `ip in NaN` was
    validate's TypeError traceback on a loaded machine."""
    rows = pd.concat([probe_rows(["10.0.0.1", "10.0.0.2"], 1), pd.DataFrame([
        {"status": "ok", "workload.name": "allreduce", "perf/headline_metric": None,
         "cluster/rank_nodes": "10.0.0.1,10.0.0.2", "cluster/rank_gpus": "0,0",
         "cluster/nccl_net": "Socket"},
        {"status": "error", "workload.name": "allreduce", "perf/headline_metric": None,
         "cluster/rank_nodes": None, "cluster/rank_gpus": None, "cluster/nccl_net": None}])])
    rows.to_parquet(tmp_path / "rows.parquet")
    facts = {"10.0.0.1": node(1), "10.0.0.2": node(1, rdma=())}
    nodes = by_subject(judge(facts, pd.read_parquet(tmp_path / "rows.parquet"), Margins())[1])
    assert nodes["node 10.0.0.1"].level == "fail" and nodes["node 10.0.0.2"].level == "pass"


def test_a_node_with_another_driver_or_too_few_gpus_fails():
    facts = {"10.0.0.1": node(), "10.0.0.2": node(), "10.0.0.3": node(driver="550.54.15"),
             "10.0.0.4": node(3)}
    nodes = by_subject(judge(facts, pd.DataFrame(), Margins(), expect_gpus=4)[1])
    assert nodes["node 10.0.0.3"].level == "fail"
    assert "driver 550.54.15, unlike the other nodes' 560.35.03" in nodes["node 10.0.0.3"].reasons[0]
    assert nodes["node 10.0.0.4"].level == "fail" and "3 GPUs, 4 expected" in \
        nodes["node 10.0.0.4"].reasons[0]
    assert nodes["node 10.0.0.1"].level == "pass"


def test_two_nodes_whose_drivers_differ_both_fail_the_same_way_every_run():
    """Neither of two disagreeing nodes is the odd one out: both are told, in every Python
    process (a set's order, which once chose the node to blame, differs between them)."""
    import subprocess
    import sys

    # the facts go in as JSON: importing this module would import the tests' torch (2 s each)
    facts = json.dumps({"10.0.0.1": node(), "10.0.0.2": node(driver="550.54.15")})
    code = ("import json, sys, pandas as pd; from raybench.validate.verdict import Margins, judge; "
            "_, nodes = judge(json.loads(sys.argv[1]), pd.DataFrame(), Margins()); "
            "print(json.dumps({v.subject: [v.level, v.reasons] for v in nodes}))")
    seen = {subprocess.run([sys.executable, "-c", code, facts],
                           env={**os.environ, "PYTHONHASHSEED": seed}, cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout
            for seed in ("1", "2", "3")}
    assert len(seen) == 1, seen
    nodes = json.loads(seen.pop())
    for ip, mine in (("10.0.0.1", "560.35.03"), ("10.0.0.2", "550.54.15")):
        level, reasons = nodes[f"node {ip}"]
        assert level == "fail"
        assert reasons == [f"fail: driver {mine}, and no driver is the nodes' usual one "
                           "(560.35.03 on 1 node, 550.54.15 on 1 node)"], reasons


def test_the_margins_file_is_checked(tmp_path):
    good = tmp_path / "m.yaml"
    good.write_text("peer_warn_pct: 5\nof_datasheet_warn_pct: 75.5\n")
    assert load_margins(good) == Margins(peer_warn_pct=5.0, of_datasheet_warn_pct=75.5)
    bad = tmp_path / "bad.yaml"
    bad.write_text("peer_margin: 5\n")
    with pytest.raises(MarginsError, match=r"bad.yaml: peer_margin: Extra inputs.*"
                       r"peer_warn_pct"):
        load_margins(bad)
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("peer_warn_pct: 150\n")
    with pytest.raises(MarginsError, match="peer_warn_pct"):
        load_margins(wrong)
    assert load_margins(None) == Margins()


def test_the_verdict_does_not_change_its_inputs():
    facts = {"10.0.0.1": node()}
    rows = probe_rows(["10.0.0.1"], 4)
    before = (copy.deepcopy(facts), rows.copy())
    judge(facts, rows, Margins())
    assert facts == before[0] and rows.equals(before[1])


class _FakeNvml:
    """pynvml's calls that sysinfo.gpu_health makes, for one GPU: a degraded x8 link at gen 4
    of a gen 5 x16 card, two volatile ECC errors, no remapping support (a NotSupported error),
    a hardware slowdown among the throttle reasons."""

    NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 1, 0, 1
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = 0
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = 1
    NVML_CLOCK_SM = 1

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return 2 if counter == self.NVML_VOLATILE_ECC else 5

    def nvmlDeviceGetRetiredPages(self, h, cause):
        return [0x1000] if cause else []

    def nvmlDeviceGetRetiredPagesPendingStatus(self, h):
        return 0

    def nvmlDeviceGetRemappedRows(self, h):
        raise RuntimeError("NVMLError_NotSupported")

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1410

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 1 | 8

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 4

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return 8

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return 16

    def nvmlDeviceGetPersistenceMode(self, h):
        return 0

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h):
        return 700_000


def test_nvml_health_facts_are_read_and_judged():
    from raybench.sysinfo import gpu_health

    health = gpu_health(_FakeNvml(), object())
    assert health == {
        "ecc_uncorrected_volatile": 2, "ecc_uncorrected_aggregate": 5, "retired_pages": 1,
        "retired_pages_pending": False, "remapped_rows_uncorrected": None,
        "remap_pending": None, "remap_failed": None, "sm_clock_mhz": 1410,
        "sm_clock_max_mhz": 1980, "throttle_reasons": ["gpu_idle", "hw_slowdown"],
        "pcie_gen": 4, "pcie_gen_max": 5, "pcie_width": 8, "pcie_width_max": 16,
        "persistence_mode": False, "power_limit_default_w": 700.0}
    facts = node(1)
    facts["gpus"][0].update(health=health, power_limit_w=500.0)
    (gpu,), _ = judge({"10.0.0.1": facts}, pd.DataFrame(), Margins())
    assert gpu.level == "fail"
    assert [r.split(":")[0] for r in gpu.reasons] == ["fail", "fail", "warn", "warn", "warn"]
    assert any("power limit 500 W, below the card's default 700 W" in r for r in gpu.reasons)


def test_a_gpu_no_probe_ran_on_is_said():
    rows = probe_rows(["10.0.0.1"], 3)  # the node has four
    gpus = by_subject(judge({"10.0.0.1": node()}, rows, Margins())[0])
    assert gpus["10.0.0.1 GPU 3"].level == "warn"
    assert gpus["10.0.0.1 GPU 3"].reasons == ["warn: no probe ran on this GPU"]


def test_a_device_one_probe_never_measured_is_not_a_pass():
    """Two CPU nodes; both memory-copy rows on the first (as in a clean clone's make test,
    before each probe trial was pinned to its node): the second passed on its matmul alone."""
    rows = probe_rows(["127.0.0.2", "127.0.0.3"], 1)
    rows["cluster/rank_gpus"] = "-"  # CPU ranks
    rows["device"] = "cpu"
    rows.loc[(rows["workload.name"] == "membw"), "cluster/rank_nodes"] = "127.0.0.2"
    gpus = by_subject(judge({"127.0.0.2": {}, "127.0.0.3": {}}, rows, Margins())[0])
    lone = gpus["127.0.0.3 CPU"]
    assert lone.level == "warn", lone.reasons
    assert lone.reasons == ["warn: the membw probe gave no figure here (it ran on the others)"]
    assert "probe/copy_gb_s" not in lone.figures
    assert gpus["127.0.0.2 CPU"].level == "pass"


def test_measured_peaks_come_from_the_newest_validation_and_give_mfu():
    """raybench.results.peaks: per precision the median GPU of the newest validation run; a later
    row's MFU against it, none for the probe's own rows or a precision never measured."""
    from raybench.results import peaks

    rows = pd.DataFrame([
        {"run_id": "old", "recorded_at": "2026-10-01", "status": "ok",
         "hardware.precision": "bf16", "perf/achieved_tflops_per_gpu": 500.0},
        *[{"run_id": "new", "recorded_at": "2026-11-01", "status": "ok",
           "hardware.precision": "bf16", "perf/achieved_tflops_per_gpu": t}
          for t in (700.0, 720.0, 650.0)],
        {"run_id": "new", "recorded_at": "2026-11-01", "status": "ok",
         "hardware.precision": "fp32", "perf/achieved_tflops_per_gpu": 50.0},
        {"run_id": "new", "recorded_at": "2026-11-01", "status": "error",
         "hardware.precision": "fp32", "perf/achieved_tflops_per_gpu": 1.0}])
    measured = peaks.peaks(rows)
    assert measured == {"bf16": 700.0, "fp32": 50.0}
    row = {"hardware.precision": "bf16", "perf/achieved_tflops_per_gpu": 350.0}
    assert peaks.mfu_measured(row, measured) == {"perf/measured_peak_tflops": 700.0,
                                                 "perf/mfu_measured_pct": 50.0}
    assert peaks.mfu_measured({**row, "hardware.precision": "tf32"}, measured) == {}
    assert peaks.mfu_measured({**row, "perf/peak_probe": True}, measured) == {}
    assert peaks.latest(None, "abc") == {}
    assert peaks.peaks(pd.DataFrame()) == {}  # an empty history has no columns


def test_the_validation_page_escapes_text_and_lists_the_worst_first():
    from raybench.validate.command import page
    from raybench.validate.verdict import Verdict

    bad = Verdict("10.0.0.1 GPU 0", figures={"probe/matmul_tflops": 300.0})
    bad.add("fail", "reason with <script>alert(1)</script>")
    good = Verdict("10.0.0.1 GPU 1", figures={"probe/matmul_tflops": 700.0})
    summary = {"suite": "v1", "verdict": "fail", "devices": {"pass": 1, "warn": 0, "fail": 1},
               "elapsed_s": 1.0, "margins": Margins().model_dump()}
    html = page([bad, good], [Verdict("node <b>x</b>")], summary)
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)" in html
    assert "node &lt;b&gt;x&lt;/b&gt;" in html
    assert html.index("GPU 0") < html.index("GPU 1") and "1 pass, 1 fail" in html


def test_the_row_writer_states_mfu_against_the_measured_peak(tmp_path, write_sweep):
    """results.writer.RowWriter adds perf/mfu_measured_pct to a row once the sweep found this
    system's measured peak (sweep.run_sweep sets writer.measured_peaks from peaks.latest)."""
    from raybench.grid import expand
    from raybench.records import TrialOutcome
    from raybench.results.table import ResultsTable
    from raybench.results.writer import RowWriter
    from raybench.spec import load_sweep

    spec = load_sweep(write_sweep())
    (trial,) = expand(spec)[:1]
    writer = RowWriter(spec, "run", ResultsTable(tmp_path / "run"), None)
    writer.measured_peaks = {"fp32": 0.2}
    writer.write(trial, TrialOutcome(status="ok", metrics={
        "perf/achieved_tflops_per_gpu": 0.05, "train/samples_per_s": 10.0}))
    row = pd.read_parquet(tmp_path / "run" / "results.parquet").iloc[0]
    assert row["perf/measured_peak_tflops"] == 0.2
    assert row["perf/mfu_measured_pct"] == pytest.approx(25.0)
