"""Host streams from PyTorch (docs/python.md): four real processes in a
gloo group, two hosts of two ranks; HostGather gathers each host's records
on the CPU to its first rank, whose Client (local_ranks) sends them on one
stream; the server stores every rank's steps as its own stream would."""

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

WORKER = textwrap.dedent("""
    import os, sys
    import torch.distributed as dist
    import trainwatch
    from trainwatch.torch import HostGather, host_ranks

    addr, run, init, rank = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=4)
    groups = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]
    group = groups[rank // 2]
    ranks = host_ranks(group)
    tw = None
    if rank == ranks[0]:
        tw = trainwatch.Client(addr, run=run, rank=rank, world_size=4, local_ranks=ranks,
                               host=f"node-{rank // 2}")
    gather = HostGather(tw, group, every=5)
    for step in range(42):
        assert gather.record(step, grad_norm=0.25 * rank + step / 64, loss=2.0,
                             step_time_s=1.0 + 0.5 * (rank == 3), batch_ids=[step, rank])
    assert gather.close()
    dist.destroy_process_group()
""")


def test_host_gather_sends_each_hosts_ranks_on_one_stream(server, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    init = f"file://{tmp_path / 'rendezvous'}"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, str(script), server.address, "host-gather",
                               init, str(r)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out
    by_rank = {}
    for rank in range(4):
        rows = server.ctl_json("steps", "--run", "host-gather", "--rank", str(rank))
        by_rank[rank] = {r["step"]: r for r in rows}
    for rank in range(4):
        assert sorted(by_rank[rank]) == list(range(42)), rank
        for step, r in by_rank[rank].items():
            assert r["grad_norm"] == 0.25 * rank + step / 64, (rank, r)
            assert r["step_time_s"] == 1.0 + 0.5 * (rank == 3), (rank, r)
    # The lead rank's records whole; the others' as the server keeps every
    # non-lead rank's (a digest: norm, step time, no batch ids).
    assert by_rank[0][7]["batch_ids"] == [7, 0]
    assert by_rank[0][7]["loss"] == 2.0
