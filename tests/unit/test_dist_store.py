"""Each role's torch.distributed store listens on the address its ranks meet at, not on every interface."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

RANK = textwrap.dedent("""
    import subprocess, sys, time
    from pathlib import Path
    import torch
    from kuberl.training import dist as kdist

    rank, portfile = int(sys.argv[1]), Path(sys.argv[2])
    listen = None
    if rank == 0:
        listen = kdist.listener("127.0.0.1")
        portfile.write_text(str(listen.getsockname()[1]))
    while not portfile.read_text():
        time.sleep(0.05)
    kdist.init_group(rank, 2, "127.0.0.1", int(portfile.read_text()), torch.device("cpu"), listen)
    kdist.dist.barrier()
    if rank == 0:
        print(subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout)
    kdist.dist.barrier()
    kdist.dist.destroy_process_group()
""")


def test_rank0_store_binds_the_rendezvous_address_only(tmp_path: Path) -> None:
    portfile = tmp_path / "port"
    portfile.write_text("")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(portfile)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for rank in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    pid = str(procs[0].pid)
    mine = [line.split() for line in outs[0][0].splitlines() if f"pid={pid}," in line]
    port = portfile.read_text()
    assert any(cols[3] == f"127.0.0.1:{port}" for cols in mine), mine  # the store, on the given address
    assert all(cols[3].startswith("127.0.0.1:") for cols in mine), mine  # nothing on * or 0.0.0.0
