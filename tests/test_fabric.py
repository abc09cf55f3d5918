"""Which network NCCL chose, read from its INFO lines; a multi-node row over sockets is noted."""

from __future__ import annotations

import os

from raybench import fabric
from raybench.report.assess import notes

# Lines as NCCL 2.x writes them with NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,NET
IB = ["node1:1234:1300 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB ; OOB "
      "ib0:10.0.0.1<0>",
      "node1:1234:1300 [0] NCCL INFO Using network IB",
      "node1:1234:1310 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0"]
ROCE = ["h:1:2 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/RoCE ; OOB eth0:10.1.0.5<0>",
        "h:1:2 [0] NCCL INFO Using network IB"]
SOCKET = ["pod-a:77:90 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>",
          "pod-a:77:90 [0] NCCL INFO Using network Socket",
          "pod-a:77:95 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0"]
EFA = ["p4de:5:6 [0] NCCL INFO NET/OFI Selected Provider is efa",
       "p4de:5:6 [0] NCCL INFO Using network AWS Libfabric"]


def test_the_network_nccl_chose():
    assert fabric.network(IB) == "IB"
    assert fabric.network(ROCE) == "IB/RoCE"
    assert fabric.network(SOCKET) == "Socket"
    assert fabric.network(EFA) == "AWS Libfabric"
    assert fabric.network(SOCKET[2:]) == "Socket"  # from a channel line alone
    assert fabric.network(["NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC"]) is None
    assert fabric.over_sockets("Socket") and not fabric.over_sockets("IB/RoCE")


def test_a_rank_reads_its_own_debug_file(tmp_path, monkeypatch):
    pattern = str(tmp_path / "nccl.%h.%p.log")
    monkeypatch.setenv("NCCL_DEBUG_FILE", pattern)
    path = fabric.own_log()
    assert path.parent == tmp_path and path.name.endswith(f".{os.getpid()}.log")
    assert fabric.read_network() is None  # no file yet
    path.write_text("\n".join(SOCKET))
    assert fabric.read_network() == "Socket"
    env = fabric.debug_env("abc123")
    assert env["NCCL_DEBUG"] == "INFO" and "%h" in env["NCCL_DEBUG_FILE"]


def test_trials_over_nccl_get_the_debug_file_and_the_users_settings_win(write_sweep):
    from raybench.grid import expand
    from raybench.runners.on_ray.train import worker_env as _worker_env
    from raybench.sections import ExecutionSpec
    from raybench.spec import load_sweep

    (gpu,) = expand(load_sweep(write_sweep(), ["grid={}", "hardware.num_gpus=2",
                                               "hardware.env.NCCL_DEBUG=WARN"]))
    env = _worker_env(gpu, ExecutionSpec())
    assert env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_FILE" in env
    assert _worker_env(gpu, ExecutionSpec(logical_gpus=True)) == {"NCCL_DEBUG": "WARN"}
    (cpu,) = expand(load_sweep(write_sweep(), ["grid={}", "hardware.cpu_workers=2"]))
    assert _worker_env(cpu, ExecutionSpec()) == {}  # gloo: nothing of NCCL's


def test_the_report_notes_a_multi_node_row_over_sockets():
    row = {"cluster/nodes_used": 2, "cluster/nccl_net": "Socket"}
    assert "TCP sockets" in notes(row)[0]
    assert notes({**row, "cluster/nccl_net": "IB"}) == []
    assert notes({**row, "cluster/nodes_used": 1}) == []  # one node: NCCL used P2P/SHM
