"""Elastic training for real: a host loses a slot mid-run and the job carries on with fewer ranks."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from hvdk8s.launcher import mpirun

from conftest import HVDK8S, REPO, discovery_script, job_env


def test_job_survives_losing_a_rank_and_resumes_from_the_last_commit(tmp_path: Path) -> None:
    hosts, discover = discovery_script(tmp_path, "localhost:2\n")
    argv = [
        HVDK8S, "run", "-np", "2", "--min-np", "1", "--max-np", "2",
        "--host-discovery-script", str(discover), "--network-interface", "lo",
        "examples/train_digits.py", "--elastic", "--epochs", "12", "--warmup-epochs", "0",
    ]  # fmt: skip
    lines: list[str] = []
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=job_env()) as job:
        assert job.stdout is not None
        for line in job.stdout:
            lines.append(line)
            if re.match(r"^\[0\] Epoch 2/12: 100%", line):
                hosts.write_text("localhost:1\n")  # the discovery script now offers one slot
        job.wait(timeout=300)
    out = "".join(lines)
    assert job.returncode == 0, out[-3000:]
    assert "[0] elastic: training on 2 ranks from epoch 0" in out
    resumed = re.search(r"^\[0\] elastic: training on 1 ranks from epoch (\d+)", out, re.M)
    assert resumed, out[-3000:]
    done = int(resumed.group(1))
    assert 2 <= done < 12
    # Horovod's pattern: fit(epochs=12 - state.epoch) after the reset; one rank now processes the whole
    # epoch, twice the steps of a 2-rank epoch
    left = 12 - done
    assert re.search(rf"^\[0\] Epoch {left}/{left}: 100%\S* 44/44", out, re.M), out[-3000:]
    accuracy = float(re.search(r"test accuracy (\d\.\d+)", out).group(1))
    assert accuracy >= 0.9


def test_horovodrun_argv_exact_and_bounds_checked() -> None:
    argv = mpirun.horovodrun_argv(
        4, ["python", "t.py"], min_np=2, max_np=8, slots=2, discovery_script="/etc/mpi/discover_hosts.sh"
    )
    assert argv == [
        "horovodrun", "-np", "4", "--min-np", "2", "--max-np", "8", "--slots", "2",
        "--host-discovery-script", "/etc/mpi/discover_hosts.sh", "python", "t.py",
    ]  # fmt: skip
    try:
        mpirun.horovodrun_argv(4, ["t"], min_np=5, max_np=8, discovery_script="d")
    except ValueError as err:
        assert "min_np (5) <= np (4)" in str(err)
    else:
        raise AssertionError("bounds not checked")
