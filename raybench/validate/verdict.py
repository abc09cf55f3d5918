"""Is every GPU healthy and as fast as it should be: a verdict per GPU and per node.

Owns the rules of `python -m raybench.validate` (to come: issue 43) and their margins, over
two inputs the sweep already writes: the probe rows (one trial per GPU of a workload with a
headline rate, and the datasheet figure beside it where the workload declares one: matmul,
membw, transfer; the all-reduce across nodes for the network NCCL chose) and each node's facts
(system_info.json's `nodes`: NVML health per GPU, versions, RDMA devices). Pure: no Ray, no
torch, no files but the margins YAML. Each verdict is `pass`,
`warn` or `fail` with its reasons, worst first.

Rules, per GPU: a probe below a share of its datasheet figure (flops.PEAK_TFLOPS,
PEAK_MEMORY_GB_S); a probe more than a margin below the median of the same GPU model and probe
in this run (the slow GPU that a DDP step time hides: every rank waits for it); a thermal or
hardware slowdown during a probe, or an SM clock under load well below the card's maximum
that the power cap does not explain;
health facts out of bounds (uncorrected ECC errors, pages waiting for retirement, a failed row
remap, a PCIe link narrower or slower than the card's, persistence mode off, a power limit
below its default). Per node: fewer GPUs than expected, a driver, CUDA or NCCL version unlike
the other nodes', NCCL over sockets between nodes where the node has RDMA devices.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from raybench import store
from raybench.columns import text
from raybench.spec import parse_yaml
from raybench.telemetry import POWER_CAP

LEVELS = ("pass", "warn", "fail")


class Margins(BaseModel):
    """What is far enough out to say so. Defaults with their reasons; a YAML file may set any."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    of_datasheet_warn_pct: float = Field(
        60.0, gt=0, le=100, description="a probe below this share of its datasheet figure "
        "warns: a healthy GPU's large GEMM and device copy reach well above it, so a figure "
        "under it is a setting (clocks, power cap, precision) or a fault to look at")
    of_datasheet_fail_pct: float = Field(
        40.0, gt=0, le=100, description="below this share it fails: no setting explains it")
    peer_warn_pct: float = Field(
        8.0, gt=0, lt=100, description="a probe this far below the median of the same GPU "
        "model in this run warns: same-model GPUs of one node run a probe within a few per "
        "cent of each other, and in DDP every rank waits for the slowest")
    peer_fail_pct: float = Field(
        20.0, gt=0, lt=100, description="this far below its peers it fails")
    clock_of_max_warn_pct: float = Field(
        75.0, gt=0, le=100, description="an SM clock under a probe's load below this share of "
        "the card's maximum warns, unless the power cap held it there (a clock setting, a "
        "slowdown NVML does not name: thermal and hardware slowdowns fail on their own)")

    @model_validator(mode="after")
    def _warn_before_fail(self) -> Margins:
        """A warning comes before a failure: a warn margin past its fail margin would never
        warn, and said nothing of what the user meant."""
        if self.of_datasheet_warn_pct <= self.of_datasheet_fail_pct:
            raise ValueError(f"of_datasheet_warn_pct ({self.of_datasheet_warn_pct:g}) must be "
                             f"above of_datasheet_fail_pct ({self.of_datasheet_fail_pct:g})")
        if self.peer_warn_pct >= self.peer_fail_pct:
            raise ValueError(f"peer_warn_pct ({self.peer_warn_pct:g}) must be below "
                             f"peer_fail_pct ({self.peer_fail_pct:g})")
        return self


class MarginsError(ValueError):
    """A margins file that cannot be used: the message names the file, the key and the fix."""


def load_margins(path: str | Path | None) -> Margins:
    """The margins a YAML file sets (read as a sweep file is: every key once, no aliases'
    surprises), each a finite number of its own type; the rest their defaults."""
    if path is None:
        return Margins()
    try:
        data = parse_yaml(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise MarginsError(f"{path}: cannot read the margins file ({store.first_line(e)}); "
                           "give a YAML mapping of margin: value") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise MarginsError(f"{path}: a margins file is a YAML mapping of margin: value, the "
                           f"margins being {', '.join(Margins.model_fields)}")
    try:  # an integer is a number here (strict mode takes no int for a float); a bool is not
        return Margins(**{k: float(v) if type(v) is int else v for k, v in data.items()})
    except OverflowError:
        raise MarginsError(f"{path}: a margin is too large a number; a margin is a per cent "
                           "from 0 to 100") from None
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err["loc"]) or "(file)"
        raise MarginsError(f"{path}: {key}: {err['msg']}; the margins are "
                           f"{', '.join(Margins.model_fields)}") from None


@dataclass
class Verdict:
    subject: str  # "node 10.0.0.2" or "10.0.0.2 GPU 3"
    level: str = "pass"
    reasons: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    def add(self, level: str, reason: str) -> None:
        self.reasons.append(f"{level}: {reason}")
        if LEVELS.index(level) > LEVELS.index(self.level):
            self.level = level

    @property
    def rank(self) -> int:
        return LEVELS.index(self.level)


# what a row says its workload measures (Workload.headline_metric, datasheet_metric): the
# verdict names no workload's column itself
HEADLINE, DATASHEET = "perf/headline_metric", "perf/datasheet_metric"


def judge(nodes: dict[str, dict[str, Any]], rows: pd.DataFrame, margins: Margins,
          expect_gpus: int | None = None) -> tuple[list[Verdict], list[Verdict]]:
    """(a verdict per GPU, a verdict per node), each list worst first."""
    gpus: dict[tuple[str, int | None], Verdict] = {}
    for ip, facts in nodes.items():
        for g in facts.get("gpus") or []:
            v = gpus[ip, int(g["index"])] = Verdict(_subject((ip, int(g["index"]))),
                                                    figures={"model": g.get("name")})
            _health(v, g.get("health") or {}, g.get("power_limit_w"))
    probed = _one_gpu_rows(rows)
    _probes(gpus, nodes, probed, margins)
    if not probed.empty:
        for v in gpus.values():
            if v.figures.keys() <= {"model"}:  # its trials did not run side by side
                v.add("warn", "no probe ran on this GPU")
        _missing_probes(gpus, probed)
    node_verdicts = _nodes(nodes, rows, expect_gpus)
    order = lambda vs: sorted(vs, key=lambda v: (-v.rank, v.subject))  # noqa: E731
    return order(gpus.values()), order(node_verdicts)


def _missing_probes(gpus: dict[tuple[str, int | None], Verdict], rows: pd.DataFrame) -> None:
    """A device that some probe never measured, where it measured its peers of the same kind
    (a GPU, a node's CPU): not a pass on that probe's word. Seen: both memory-copy trials of
    a two-node CPU suite landed on one node, and the other passed on its matmul alone."""
    ran = rows.groupby("gpu_key")["workload.name"].agg(set).to_dict()
    for kind_is_cpu in (True, False):
        keys = [k for k in ran if (k[1] is None) == kind_is_cpu]
        every = set().union(*(ran[k] for k in keys)) if keys else set()
        for key, v in gpus.items():
            if (key[1] is None) != kind_is_cpu or v.figures.keys() <= {"model"}:
                continue  # its own warning above names a device no probe ran on
            for probe in sorted(every - ran.get(key, set())):
                v.add("warn", f"the {probe} probe gave no figure here (it ran on the others)")


def _health(v: Verdict, h: dict[str, Any], limit: float | None) -> None:
    if h.get("ecc_uncorrected_volatile"):
        v.add("fail", f"{h['ecc_uncorrected_volatile']} uncorrected ECC errors since the "
              "driver loaded")
    elif h.get("ecc_uncorrected_aggregate"):
        v.add("warn", f"{h['ecc_uncorrected_aggregate']} uncorrected ECC errors over the "
              "device's life")
    if h.get("retired_pages_pending"):
        v.add("fail", "a page retirement waits for a GPU reset")
    if h.get("remap_failed"):
        v.add("fail", "a row remap failed: the memory has no spare rows left")
    elif h.get("remap_pending"):
        v.add("warn", "a row remap waits for a GPU reset")
    width, width_max = h.get("pcie_width"), h.get("pcie_width_max")
    if width and width_max and width < width_max:
        v.add("fail", f"PCIe link x{width}, the card's is x{width_max} (a degraded link)")
    gen, gen_max = h.get("pcie_gen"), h.get("pcie_gen_max")
    if gen and gen_max and gen < gen_max:
        v.add("warn", f"PCIe link at gen {gen}, the card's is gen {gen_max} (read at rest, "
              "when a link may step down to save power; the transfer probe shows the rate)")
    if h.get("persistence_mode") is False:
        v.add("warn", "persistence mode off: the driver unloads between jobs and each start "
              "pays its initialisation")
    default = h.get("power_limit_default_w")
    if limit and default and limit < default:
        v.add("warn", f"power limit {limit:g} W, below the card's default {default:g} W")


def _one_gpu_rows(rows: pd.DataFrame) -> pd.DataFrame:
    """The probe rows of one GPU each, with the GPU they ran on: (node, GPU index)."""
    if rows.empty or HEADLINE not in rows:
        return rows.iloc[0:0]
    rows = rows[rows[HEADLINE].notna() & (rows["status"] == "ok")].copy()
    gpu = rows["cluster/rank_gpus"].astype(str)
    one = gpu.str.fullmatch(r"\d+") | (gpu == "-")  # one GPU, or a CPU rank (no GPU: "-")
    rows = rows[one & ~rows["cluster/rank_nodes"].astype(str).str.contains(",")]
    rows["gpu_key"] = [(str(ip), int(g) if g != "-" else None) for ip, g in
                       zip(rows["cluster/rank_nodes"], rows["cluster/rank_gpus"].astype(str),
                           strict=True)]
    return rows


def _subject(key: tuple[str, int | None]) -> str:
    ip, index = key
    return f"{ip} CPU" if index is None else f"{ip} GPU {index}"


def _settings(columns: Any) -> list[str]:
    """A probe row's setting columns: the probe and its parameters, the precision; not the
    seed, which validate varies to run a trial per GPU."""
    return sorted(k for k in columns if k.startswith("workload.") and k != "workload.seed"
                  or k == "hardware.precision")


def _setting(row: pd.Series) -> tuple:
    """What makes two probe rows comparable: the probe and its settings, the GPU model."""
    return (row.get("device"), *[(k, str(row[k])) for k in _settings(row.index)])


def _probes(gpus: dict[tuple[str, int | None], Verdict], nodes: dict[str, dict[str, Any]],
            rows: pd.DataFrame, m: Margins) -> None:
    if rows.empty:
        return
    varied = {name: _varied(probe) for name, probe in rows.groupby("workload.name")}
    groups = rows.groupby(rows.apply(_setting, axis=1), sort=False)
    for _, group in groups:
        probe = group["workload.name"].iloc[0]
        col = what = group[HEADLINE].iloc[0]
        sheet_col = group[DATASHEET].iloc[0] if DATASHEET in group else None
        sheet_col = None if pd.isna(sheet_col) else sheet_col
        peers = statistics.median(group[col])
        for _, row in group.iterrows():
            v = gpus.setdefault(row["gpu_key"], Verdict(_subject(row["gpu_key"])))
            value = float(row[col])
            v.figures[f"{col} {_label(row, varied[probe])}".strip()] = value
            sheet = row.get(sheet_col) if sheet_col else None
            if sheet and not pd.isna(sheet):
                share = 100.0 * value / float(sheet)
                if share < m.of_datasheet_fail_pct:
                    v.add("fail", f"{what} {value:.4g}: {share:.0f}% of the datasheet's "
                          f"{float(sheet):g}")
                elif share < m.of_datasheet_warn_pct:
                    v.add("warn", f"{what} {value:.4g}: {share:.0f}% of the datasheet's "
                          f"{float(sheet):g}")
            below = 100.0 * (1 - value / peers) if len(group) > 1 and peers else 0.0
            if below > m.peer_fail_pct:
                v.add("fail", f"{what} {value:.4g}: {below:.0f}% below the median of "
                      f"{len(group)} like GPUs ({peers:.4g})")
            elif below > m.peer_warn_pct:
                v.add("warn", f"{what} {value:.4g}: {below:.0f}% below the median of "
                      f"{len(group)} like GPUs ({peers:.4g})")
            # the clock: under the probes that load the device's own units (those with a
            # datasheet figure), not under host-device copies, which leave the SMs idle
            _under_load(v, row, nodes, m, probe, judge_clock=sheet_col is not None)


def _label(row: pd.Series, varied: list[str]) -> str:
    """The settings that tell this probe row from the probe's others (precision, direction)."""
    return " ".join(f"{k.split('.', 1)[1]}={row[k]}" for k in varied if not pd.isna(row[k]))


def _varied(rows: pd.DataFrame) -> list[str]:
    """The setting columns whose values differ between rows of one probe."""
    return [k for k in _settings(rows.columns) if rows[k].astype(str).nunique() > 1]


def _under_load(v: Verdict, row: pd.Series, nodes: dict[str, dict[str, Any]], m: Margins,
                probe: str, judge_clock: bool) -> None:
    if row.get("gpu/throttled") is True:
        v.add("fail", f"a thermal or hardware slowdown under the {probe} probe "
              f"({row.get('gpu/throttle_reasons')})")
    clock = row.get("gpu/sm_clock_mean_mhz")
    ip, index = row["gpu_key"]
    facts = next((g for g in (nodes.get(ip) or {}).get("gpus") or []
                  if int(g["index"]) == index), {})
    top = (facts.get("health") or {}).get("sm_clock_max_mhz")
    # A clock the power cap held down is the card working as designed: a dense bf16 GEMM on
    # the lent H200 ran at 1,473-1,577 MHz of 1,980 under its default 700 W limit (the health
    # rules judge a limit set below its default, and the datasheet rule the figure reached)
    capped = POWER_CAP in text(row.get("gpu/throttle_reasons")).split(",")
    if judge_clock and clock and top and not capped \
            and 100.0 * clock / top < m.clock_of_max_warn_pct:
        v.add("warn", f"SM clock {clock:.0f} MHz under the {probe} probe, "
              f"{100 * clock / top:.0f}% of the card's {top:g} MHz")


def _nodes(nodes: dict[str, dict[str, Any]], rows: pd.DataFrame,
           expect_gpus: int | None) -> list[Verdict]:
    out = []
    versions = {ip: _versions(f) for ip, f in nodes.items() if "error" not in f}
    usual = {k: _usual([v[k] for v in versions.values()]) for k in ("driver", "cuda", "nccl")}
    for ip, facts in nodes.items():
        v = Verdict(f"node {ip}")
        out.append(v)
        if "error" in facts:
            v.add("fail", f"its facts could not be read: {facts['error']}")
            continue
        n = len(facts.get("gpus") or [])
        v.figures.update(gpus=n, **versions[ip])
        if expect_gpus is not None and n != expect_gpus:
            v.add("fail", f"{n} GPUs, {expect_gpus} expected")
        for key, level in (("driver", "fail"), ("cuda", "warn"), ("nccl", "warn")):
            mine, (most, counts) = versions[ip][key], usual[key]
            if len(counts) < 2:
                continue
            if most is _NO_MAJORITY:  # no node is the odd one out: each is told
                spread = ", ".join(f"{value} on {c} node{'s' * (c > 1)}"
                                   for value, c in counts.items())
                v.add(level, f"{key} {mine}, and no {key} is the nodes' usual one ({spread})")
            elif mine != most:
                v.add(level, f"{key} {mine}, unlike the other nodes' {most}")
        rdma = facts.get("rdma_devices") or []
        nets = _nets_of(rows, ip)
        if rdma and any(n.lower().startswith("socket") for n in nets):
            v.add("fail", f"NCCL ran over sockets between nodes though this node has RDMA "
                  f"devices ({', '.join(rdma)}): check NCCL_IB_* / the EFA plugin")
    return out


def _versions(facts: dict[str, Any]) -> dict[str, Any]:
    gpus = facts.get("gpus") or []
    return {"driver": gpus[0].get("driver") if gpus else None,
            "cuda": (facts.get("cuda") or {}).get("torch_cuda"),
            "nccl": (facts.get("cuda") or {}).get("nccl")}


_NO_MAJORITY = object()


def _usual(values: list[Any]) -> tuple[Any, Counter]:
    """The value most nodes have, and how many have each; `_NO_MAJORITY` where two values
    tie for most (two nodes that disagree: neither is the odd one out, and which one a set's
    order named differed from run to run)."""
    counts = Counter(values)
    top = counts.most_common(2)
    if len(top) > 1 and top[0][1] == top[1][1]:
        return _NO_MAJORITY, counts
    return (top[0][0] if top else None), counts


def _nets_of(rows: pd.DataFrame, ip: str) -> list[str]:
    """The networks NCCL chose in the rows whose ranks spanned this node and another."""
    if rows.empty or "cluster/nccl_net" not in rows:
        return []
    # a row whose trial never started has no nodes: pandas 3 keeps that cell missing through
    # astype(str), and `ip in NaN` raised (validate's traceback under a loaded CI machine)
    spans = rows["cluster/rank_nodes"].map(lambda x: x.split(",") if isinstance(x, str) else [])
    multi = spans.apply(lambda nodes: ip in nodes and len(set(nodes)) > 1)
    return [str(n) for n in rows.loc[multi, "cluster/nccl_net"].dropna()]
