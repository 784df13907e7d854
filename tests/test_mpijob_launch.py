"""The rendered MPIJob launcher command run for real under Open MPI, against the hostfile the MPI Operator
writes for one worker (no sshd here: what the launcher's wait hands over to). Not ``unit``: real MPI jobs."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hvdk8s.launcher.mpirun import rank_lines
from hvdk8s.mpijob import load_spec, render
from hvdk8s.mpijob.spec import JobSpec

from test_mpijob import BASE, launcher, mpirun_of


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed")
def test_launcher_command_runs_against_an_operator_style_hostfile(tmp_path: Path):
    """The rendered argv is accepted by Open MPI and its -np exactly fills the
    hostfile the operator writes (workers x slotsPerWorker slots; one more rank
    would fail with "not enough slots"). Single host, so no ssh and no proof of
    -x forwarding: the network-namespace test runs it across hosts."""
    probe = "import os, sys; sys.stdout.write(f\"rank-env {os.environ['HVDK8S_JOB_NAME']} {os.environ['DATA_DIR']}\\n\")"
    spec = load_spec(BASE | {"workers": 1, "slotsPerWorker": 2, "command": [sys.executable, "-c", probe],
                             "env": {"DATA_DIR": "/shared/data"}})  # fmt: skip
    lines, _ = run_launcher(spec, tmp_path)
    assert sorted(line for line in lines if "rank-env" in line[1]) == [
        (0, "rank-env digits /shared/data"),
        (1, "rank-env digits /shared/data"),
    ]


def run_launcher(spec: JobSpec, tmp_path: Path) -> tuple[list[tuple[int | None, str]], str]:
    """Run the rendered launcher command against the hostfile the operator writes for one worker.

    Returns its ranks' lines and mpirun's standard error.
    """
    container = launcher(render(spec))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text(f"localhost slots={spec.slots_per_worker}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "HVDK8S_"))}
    env |= {e["name"]: e["value"] for e in container["env"]}
    env |= {"OMPI_MCA_orte_default_hostfile": str(hostfile), "OMPI_MCA_orte_keep_fqdn_hostnames": "true"}
    # No sshd here to wait for: run what the wait hands over to (test_mpijob_cluster tests the wait).
    proc = subprocess.run(mpirun_of(container), env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return list(rank_lines(proc.stdout.splitlines())), proc.stderr


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="Open MPI not installed")
def test_ranks_allreduce_with_the_algorithm_the_spec_names(tmp_path: Path):
    """The rendered launcher's ranks get the algorithm, Open MPI accepts it, and MPI_Allreduce sums correctly."""
    probe = ("import os, sys, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD; out = np.zeros(4); "
             "c.Allreduce(np.arange(4.0) + c.rank, out); "
             "print('allreduce', out.tolist(), os.environ['OMPI_MCA_coll_tuned_allreduce_algorithm'])")
    for algorithm in ("recursive_doubling", "ring"):
        spec = load_spec(BASE | {"workers": 1, "slotsPerWorker": 2, "command": [sys.executable, "-c", probe],
                                 "openMpi": {"allreduceAlgorithm": algorithm}})  # fmt: skip
        lines, stderr = run_launcher(spec, tmp_path)
        assert sorted(line for line in lines if "allreduce" in line[1]) == [
            (0, f"allreduce [1.0, 3.0, 5.0, 7.0] {algorithm}"),
            (1, f"allreduce [1.0, 3.0, 5.0, 7.0] {algorithm}"),
        ]
        assert "invalid value" not in stderr  # Open MPI warns, and falls back, on a name it does not know
