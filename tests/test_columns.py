"""Metric columns declared with their units where produced: the rules, and that rows obey them."""

from __future__ import annotations

import pandas as pd
import pyarrow.parquet as pq
import pytest

from raybench import columns
from raybench.columns import Metric
from raybench.metrics import summarize
from tests.test_metrics import record


def test_a_unit_must_agree_with_the_key():
    with pytest.raises(ValueError, match="the key says 'ms', declared 's'"):
        Metric("x/step_ms", "s", "")
    with pytest.raises(ValueError, match="the key says '\\*/s'"):
        Metric("x/samples_per_s", "MB", "")
    with pytest.raises(ValueError, match="is not one of"):
        Metric("x/thing", "furlongs", "")
    assert Metric("x/pixels_per_s_per_mb", "pixels/s/MB", "").unit == "pixels/s/MB"


def test_one_key_one_unit():
    columns.declare(Metric("testonly/size_mb", "MB", "a"))
    columns.declare(Metric("testonly/size_mb", "MB", "again, same unit: fine"))
    with pytest.raises(ValueError, match="declared twice"):
        columns.declare(Metric("testonly/thing", "count", ""), Metric("testonly/thing", "s", ""))


def test_families_match_their_members_only():
    import raybench.scenarios.offline  # noqa: F401  (declares the infer/* columns)

    assert columns.lookup("train/step_time_p99_ms").unit == "ms"
    assert columns.lookup("train/forward_mean_ms").unit == "ms"
    assert columns.lookup("train/nothing_like_this") is None
    assert columns.lookup("infer/batch_p50_ms").unit == "ms"


def test_every_column_of_a_training_row_is_declared():
    recs = []
    for rank in (0, 1):
        r = record(rank, 0.1, alloc=10.0)
        r.update(workload="vit_tiles", describe={"pixels_per_sample": 64 * 64},
                 phase_s={"forward": [0.03] * 10, "backward": [0.05] * 10},
                 own_s=[0.08] * 10, cpu_util_pct=90.0,
                 gpu={"util_mean_pct": 90.0, "util_max_pct": 99.0, "power_mean_w": 300.0,
                      "energy_j": 30.0, "temp_max_c": 60.0, "sm_clock_mean_mhz": 1900.0,
                      "throttled": False, "power_capped_pct": 0.0, "throttle_reasons": ""})
        recs.append(r)
    m = summarize(recs)
    assert "train/pixels_per_s" in m and "gpu/energy_j" in m and "train/forward_p50_ms" in m
    assert columns.check(list(m), "test") == []


def test_an_undeclared_column_fails_under_strict_and_warns_otherwise(monkeypatch, caplog):
    with pytest.raises(ValueError, match="testonly/undeclared_ms.*declare each"):
        columns.check(["testonly/undeclared_ms", "workload.batch_size"], "here")
    monkeypatch.delenv(columns.STRICT_ENV)
    assert columns.check(["testonly/undeclared_ms"], "here") == ["testonly/undeclared_ms"]
    assert "without a declaration" in caplog.text


def test_the_table_carries_its_units_to_the_report(tmp_path):
    from raybench.report.page import _table
    from raybench.results.table import write_parquet

    frame = pd.DataFrame([{"trial_key": "a", "train/step_time_p50_ms": 12.5,
                           "workload.batch_size": 8}])
    write_parquet(frame, tmp_path / "results.parquet")
    units = columns.read_metadata(pq.read_schema(tmp_path / "results.parquet").metadata)
    assert units == {"train/step_time_p50_ms": {
        "unit": "ms", "doc": columns.lookup("train/step_time_p50_ms").doc}}
    html = _table(list(frame.columns), frame.to_dict("records"), units)
    assert "train/step_time_p50_ms<span class='unit'>ms</span>" in html
    assert columns.read_metadata(None) == {}  # a table written before units: none shown
