"""Every file in cluster/ parses, names sweeps that exist, and offers nodes those sweeps fit on:
each file's GPUs per node match the sweep's system, and every trial of the sweep can be placed
on the nodes the file describes."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from raybench.grid import expand
from raybench.runners.on_ray.plan import placement
from raybench.spec import load_sweep

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for p in (ROOT / "cluster").rglob("*") if p.is_file() and p.name != "Dockerfile")


def named_sweeps(text: str) -> list[str]:
    lines = [ln for ln in text.splitlines() if ln.startswith("# raybench-sweeps:")]
    assert len(lines) == 1, "one '# raybench-sweeps: ...' line says which sweeps a file suits"
    return [s.strip() for s in lines[0].split(":", 1)[1].split(",") if s.strip()]


def _flag(text: str, name: str) -> float:
    m = re.search(rf"--{name}[= ]\"?(\d+)", text)
    assert m, f"--{name} not found"
    return float(m.group(1))


def node_shape(path: Path) -> tuple[dict[str, float], int]:
    """(resources of one GPU node, how many such nodes) as the file declares them."""
    text = path.read_text()
    if path.suffix == ".sbatch":
        cpus = _flag(text, "cpus-per-task")
        return {"CPU": cpus, "GPU": _flag(text, "gpus-per-node")}, int(_flag(text, "nodes"))
    doc = yaml.safe_load(text)
    if doc.get("kind") in ("RayCluster", "RayJob"):
        spec = doc["spec"] if doc["kind"] == "RayCluster" else doc["spec"]["rayClusterSpec"]
        group = spec["workerGroupSpecs"][0]
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        return ({"CPU": float(limits["cpu"]), "GPU": float(limits["nvidia.com/gpu"])},
                int(group["maxReplicas"]))
    if doc["provider"]["type"] == "local":
        cmd = " ".join(doc["worker_start_ray_commands"])
        return ({"CPU": _flag(cmd, "num-cpus"), "GPU": _flag(cmd, "num-gpus")},
                1 + len(doc["provider"]["worker_ips"]))
    gpu_types = [t for t in doc["available_node_types"].values()
                 if t["resources"].get("GPU", 0) > 0]
    t = gpu_types[0]
    return {k: float(v) for k, v in t["resources"].items()}, int(t["max_workers"])


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cluster_file_parses_and_fits_its_sweeps(path: Path):
    text = path.read_text()
    if path.suffix == ".sbatch":
        subprocess.run(["bash", "-n", str(path)], check=True)
    else:
        assert yaml.safe_load(text)
    sweeps = named_sweeps(text)
    assert sweeps
    node, count = node_shape(path)
    # the Tune trial's own 0.01 CPU shares a node with the workers
    nodes = [dict(node) for _ in range(count)]
    for name in sweeps:
        assert (ROOT / name).is_file(), f"{path.name} names {name}, which does not exist"
        spec = load_sweep(ROOT / name)
        assert spec.system.gpus_per_node == node["GPU"], \
            f"{name} is for {spec.system.gpus_per_node} GPUs per node, {path.name} has {node['GPU']}"
        for trial in expand(spec):
            why = placement(trial, nodes)
            assert why is None, f"{name} trial {trial.index} on {path.name}: {why}"


def test_dockerfile_copies_what_exists():
    text = (ROOT / "cluster" / "Dockerfile").read_text()
    assert re.search(r"^FROM rayproject/ray:2\.60\.", text, re.M)
    for line in re.findall(r"^COPY (?:--\S+ )*(.+) \S+$", text, re.M):
        for src in line.split():
            assert (ROOT / src).exists(), src


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="no Slurm here; bash -n checks syntax")
def test_sbatch_is_accepted_by_slurm():
    for p in (ROOT / "cluster" / "slurm").glob("*.sbatch"):
        subprocess.run(["sbatch", "--test-only", str(p)], check=True)


def test_multi_node_files_give_nccl_the_fabric():
    """Without these NCCL falls back to TCP sockets between nodes (cluster/nccl_net: Socket)."""
    sbatch = (ROOT / "cluster" / "slurm" / "raybench_dgx_a100.sbatch").read_text()
    assert "SRUN_CPUS_PER_TASK=$SLURM_CPUS_PER_TASK" in sbatch  # srun >= 22.05 inherits none
    assert sbatch.count("srun $STEP") == 2 and "--gpus-per-task=8" in sbatch
    assert "NCCL_IB_HCA" in sbatch
    pod = yaml.safe_load((ROOT / "cluster" / "kuberay" / "raycluster_dgx_a100.yaml").read_text())
    worker = pod["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert "IPC_LOCK" in worker["securityContext"]["capabilities"]["add"]
    assert {e["name"] for e in worker["env"]} >= {"NCCL_IB_HCA"}
    p4de = yaml.safe_load((ROOT / "cluster" / "launcher" / "aws_p4de.yaml").read_text())
    node = p4de["available_node_types"]["gpu_a100_80g"]["node_config"]
    efa = [n for n in node["NetworkInterfaces"] if n["InterfaceType"] == "efa"]
    assert sorted(n["NetworkCardIndex"] for n in efa) == [0, 1, 2, 3]  # one EFA per card
    assert "FI_PROVIDER=efa" in " ".join(p4de["worker_start_ray_commands"])


DATA_KEYS = ("preprocess.scenes", "preprocess.labels", "preprocess.out", "workload.scenes",
             "workload.labels", "workload.val_scenes", "workload.val_labels",
             "workload.shoreline", "output.storage")


def test_pods_without_a_shared_volume_keep_their_data_in_a_bucket():
    """A KubeRay job whose pods share no volume runs its sweeps with every data location and
    the results' storage at a URI (its entrypoint's --set), which every pod reaches."""
    path = ROOT / "cluster" / "kuberay" / "rayjob_gb200.yaml"
    doc = yaml.safe_load(path.read_text())
    pods = [doc["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in doc["spec"]["rayClusterSpec"]["workerGroupSpecs"])]
    shared = [v for pod in pods for v in pod.get("volumes", [])
              if not set(v) & {"emptyDir", "configMap", "secret"}]
    assert shared == [], "this file is the example of pods without a shared volume"
    argv = shlex.split(doc["spec"]["entrypoint"])
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    sweep = argv[argv.index("raybench.sweep") + 1]
    spec = load_sweep(ROOT / sweep, sets)
    for key in DATA_KEYS:
        section, field = key.split(".")
        value = getattr(getattr(spec, section), field)
        assert "://" in str(value), f"{path.name}: {key}={value} is a pod's own disk"
