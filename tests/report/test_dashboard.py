"""The Grafana dashboard asks only for series that the installed Ray exports."""

from __future__ import annotations

import json
import re
from pathlib import Path

import ray

from tests.conftest import ROOT


def test_dashboard_metrics_exist_in_ray():
    dash = json.loads((ROOT / "dashboards" / "raybench_grafana.json").read_text())
    ray_src = Path(ray.__file__).parent
    sources = (ray_src / "dashboard" / "modules" / "reporter" / "reporter_agent.py").read_text()
    sources += "".join(p.read_text() for p in (ray_src / "train" / "v2" / "_internal" /
                                                "metrics").glob("*.py"))
    assert dash["panels"]
    for panel in dash["panels"]:
        for target in panel["targets"]:
            for metric in re.findall(r"ray_([a-z_]+)\{", target["expr"]):
                assert f'"{metric}"' in sources, (panel["title"], metric)
