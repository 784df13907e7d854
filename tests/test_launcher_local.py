"""``hvdk8s run``: real mpirun, rank-prefixed output, failures named by rank."""
from __future__ import annotations

import io
import shutil
import sys
from pathlib import Path

import pytest

from hvdk8s.common.errors import UserError
from hvdk8s.launcher import local, mpirun

from conftest import SCRIPTS, discovery_script, hvdk8s_cli, run_ranks


def test_failing_rank_fails_the_job_and_is_named() -> None:
    proc = run_ranks(2, "fail_on_rank.py", check=False, timeout=120)
    assert proc.returncode != 0
    assert "[0] hello from rank 0" in proc.stdout
    assert "[1] hello from rank 1" in proc.stdout
    # mpirun may name either rank first; the summary must point at rank 1
    assert "job failed: rank 1 left the job first" in proc.stderr or "job failed: rank 1 exited with code 3" in proc.stderr


def test_missing_script_is_a_clear_error() -> None:
    proc = run_ranks(2, "no_such_script.py", check=False, timeout=30)
    assert proc.returncode == 2
    # the subcommand names itself (the script's argv list used to take its place: hvdk8s ['...']: error:)
    assert proc.stderr == f"hvdk8s run: error: script {SCRIPTS / 'no_such_script.py'}: no such file\n"


def test_hosts_with_a_discovery_script_is_refused() -> None:
    proc = hvdk8s_cli("run", "-np", "2", "-H", "a:2", "--host-discovery-script", "/bin/true", "train.py", check=False, timeout=30)
    assert proc.returncode == 2
    assert "-H/--hosts: elastic runs take their hosts from --host-discovery-script" in proc.stderr


@pytest.mark.parametrize("hosts", [
    "localhost", "a:2,b:2", "node-1.svc.cluster.local:8,10.0.0.7", "a,a:2,a", "a:01",
    "a:*,b:auto",  # slots detected: the host's cores
    "+n0,+n1,+e,+e:2",  # relative to the allocation (a hostfile, a resource manager's)
])  # fmt: skip
def test_host_lists_open_mpi_takes(hosts: str) -> None:
    mpirun.check_hosts(hosts)


@pytest.mark.parametrize("hosts, message", [
    ("foo:x", "'foo:x': slots 'x' is not a whole number above 0 (or * or auto)"),
    ("a:0", "'a:0': slots '0' is not a whole number above 0 (or * or auto)"),
    ("a:-1", "'a:-1': slots '-1' is not a whole number above 0 (or * or auto)"),
    ("a:2:3", "'a:2:3': slots '2:3' is not a whole number above 0 (or * or auto)"),
    (":", "':': no host name"),
    (":2", "':2': no host name"),
    ("", "'': no host name"),
    ("a:2,", "'': no host name"),
    ("a, b", "' b': ' b' is not a host name or IPv4 address"),
    ("-a:2", "'-a:2': '-a' is not a host name or IPv4 address"),
    ("a..b", "'a..b': 'a..b' is not a host name or IPv4 address"),
    ("+x", "'+x': '+x' is not a host name or IPv4 address"),
    ("fe80::1", "'fe80::1': slots ':1' is not a whole number above 0 (or * or auto)"),  # Open MPI 4's -H takes no IPv6
])  # fmt: skip
def test_host_lists_open_mpi_refuses(hosts: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        mpirun.check_hosts(hosts)
    assert str(err.value) == message


def test_a_bad_host_list_is_refused_before_mpirun() -> None:
    """Not mpirun's ssh attempt to a host named "foo" or its "option -H did not have enough parameters"."""
    for hosts, message in [
        ("foo:x", "'foo:x': slots 'x' is not a whole number above 0 (or * or auto)"),
        (":", "':': no host name"),
    ]:
        proc = hvdk8s_cli("run", "-np", "2", "-H", hosts, sys.executable, "-c", "pass", check=False, timeout=30)
        assert (proc.returncode, proc.stdout, proc.stderr) == (
            2, "", f"hvdk8s run: error: -H/--hosts: {message} (expected host or host:slots, comma-separated)\n")
    # a good list reaches mpirun: a real 2-rank job on a host listed twice (one slot each)
    proc = hvdk8s_cli("run", "-np", "2", "-H", "localhost,localhost", sys.executable, "-c", "print('up')", timeout=120)
    assert sorted(proc.stdout.splitlines()) == ["[0] up", "[1] up"]


def test_elastic_only_flags_without_a_discovery_script_are_refused() -> None:
    # --slots counts the slots of discovered hosts; a plain run takes them in -H host:slots
    for flags in (("--slots", "2"), ("--min-np", "1")):
        proc = hvdk8s_cli("run", "-np", "2", *flags, "train.py", check=False, timeout=30)
        assert (proc.returncode, proc.stderr) == (2, "hvdk8s run: error: --min-np/--max-np/--slots/--blacklist-cooldown: "
                                                     "elastic runs need --host-discovery-script (a plain run takes "
                                                     "slots in -H host:slots)\n")


def test_elastic_runs_do_not_need_mpirun(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Elastic runs execute horovodrun over Gloo: where hvdk8s finds no mpirun, they still run (a real one-rank
    job), and --network-interface reaches Gloo (horovodrun sets HOROVOD_GLOO_IFACE from it)."""
    which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name, *args, **kw: None if name == "mpirun" else which(name, *args, **kw))
    probe = [sys.executable, "-c", "import os; print('gloo interface', os.environ['HOROVOD_GLOO_IFACE'])"]
    with pytest.raises(UserError, match="mpirun not found"):
        local.run(1, probe)
    _, discover = discovery_script(tmp_path, "localhost:1\n")
    out = io.StringIO()
    elastic = local.ElasticOptions(min_np=1, max_np=1, discovery_script=str(discover))
    assert local.run(1, probe, elastic=elastic, network_interface="lo", out=out) == 0, out.getvalue()
    assert "[0] gloo interface lo\n" in out.getvalue()


def test_a_blacklist_cooldown_horovod_refuses_is_a_clear_error() -> None:
    # Horovod itself would raise in its driver's discovery thread: "Exception in thread", exit code 1
    proc = hvdk8s_cli("run", "-np", "1", "--min-np", "1", "--max-np", "1", "--host-discovery-script", "/bin/true",
                      "--blacklist-cooldown", "10", "7200", sys.executable, "-c", "pass", check=False, timeout=30)
    assert (proc.returncode, proc.stderr) == (2, "hvdk8s run: error: --blacklist-cooldown: blacklist cooldown: need "
                                                 "1 <= min (10) <= max (7200) <= 3600 seconds (Horovod refuses a min "
                                                 "below 1 or a max above 3600)\n")


def test_transport_settings_reach_open_mpi_and_elastic_runs_refuse_them() -> None:
    probe = ("import os, numpy as np; from mpi4py import MPI; c = MPI.COMM_WORLD; out = np.zeros(4); "
             "c.Allreduce(np.arange(4.0) + c.rank, out); "
             "print('sum', out.tolist(), *(os.environ['OMPI_MCA_' + n] for n in ('coll_tuned_allreduce_algorithm', "
             "'btl_tcp_eager_limit', 'btl_tcp_rndv_eager_limit', 'btl_tcp_max_send_size', 'btl_tcp_if_include', "
             "'oob_tcp_if_include')), os.environ['NCCL_SOCKET_IFNAME'])")
    # --network-interface: as horovodrun's on an mpirun job (Open MPI's TCP transport, NCCL), plus mpirun's wire-up
    proc = hvdk8s_cli("run", "-np", "2", "--allreduce-algorithm", "recursive_doubling", "--tcp-eager-limit", "1048576",
                      "--network-interface", "lo", sys.executable, "-c", probe, timeout=120)
    assert sorted(line for line in proc.stdout.splitlines() if "sum" in line) == [
        f"[{rank}] sum [1.0, 3.0, 5.0, 7.0] recursive_doubling 1048576 1048576 1048576 lo lo lo" for rank in (0, 1)
    ]
    assert "invalid value" not in proc.stdout  # Open MPI warns (ranks' output), and falls back, on a name it does not know
    for flags, message in [
        (("--allreduce-algorithm", "ring"), "--allreduce-algorithm: elastic runs use horovodrun over Gloo"),
        (("--tcp-eager-limit", "1048576"), "--tcp-eager-limit: elastic runs use horovodrun over Gloo"),
    ]:
        proc = hvdk8s_cli("run", "-np", "2", *flags, "--host-discovery-script", "/bin/true", "train.py",
                          check=False, timeout=30)
        assert proc.returncode == 2
        assert message in proc.stderr
    proc = hvdk8s_cli("run", "-np", "2", "--tcp-eager-limit", "4096", "train.py", check=False, timeout=30)
    assert proc.returncode == 2
    assert "--tcp-eager-limit 4096: must be between 65536 (Open MPI's default) and 1073741824 bytes" in proc.stderr


def test_mpirun_argv_exact() -> None:
    argv = mpirun.mpirun_argv(
        4, ["python", "train.py", "--epochs", "3"], hosts="a:2,b:2", env_names=["PATH", "NCCL_DEBUG"], allow_run_as_root=True
    )
    assert argv == [
        "mpirun", "-np", "4", "--allow-run-as-root", "-H", "a:2,b:2",
        "-bind-to", "none", "-map-by", "slot", "--tag-output", "-mca", "pml", "ob1", "-mca", "btl", "^openib",
        "-mca", "btl_tcp_eager_limit", "16777216", "-mca", "btl_tcp_max_send_size", "16777216",
        "-mca", "btl_tcp_rndv_eager_limit", "16777216", "-mca", "mpi_yield_when_idle", "1",
        "-x", "PATH", "-x", "NCCL_DEBUG",
        "python", "train.py", "--epochs", "3",
    ]


def test_mca_overrides_replace_the_defaults_instead_of_repeating_them() -> None:
    argv = mpirun.mpirun_argv(2, ["t"], mca={"mpi_yield_when_idle": "0", "btl_tcp_if_include": "eth0"})
    assert argv.count("mpi_yield_when_idle") == 1
    assert argv[argv.index("mpi_yield_when_idle") + 1] == "0"
    assert argv[argv.index("btl_tcp_if_include") + 1] == "eth0"
    assert mpirun.transport_mca(network_interface="eth1") == {
        **mpirun.transport_mca(), "btl_tcp_if_include": "eth1", "oob_tcp_if_include": "eth1"}


def test_forwarded_env_picks_library_knobs_only() -> None:
    environ = {"PATH": "/bin", "HOROVOD_FUSION_THRESHOLD": "0", "NCCL_DEBUG": "INFO", "HOME": "/root", "SECRET": "x"}
    assert mpirun.forwarded_env(environ) == ["HOROVOD_FUSION_THRESHOLD", "NCCL_DEBUG", "PATH"]


def test_rank_lines_and_failure_report() -> None:
    # an unbuffered print's text and newline are two writes; rank 1's write landed in between
    stream = [
        "[1,0]<stdout>:epoch 3[1,1]<stdout>:hello from rank 1[1,0]<stdout>:\n",
        "[1,1]<stdout>:\n",
        "[1,0]<stderr>:warn[1,0]<stdout>:accuracy 0.97[1,0]<stdout>:\n",
        "--- mpirun's own report\n",
        "[3]<stderr>:boom[1,0]<stderr>:ing\n",
        "[1,1]<stdout>:dying mid-line",
    ]
    assert list(mpirun.rank_lines(stream)) == [
        (0, "epoch 3"),
        (1, "hello from rank 1"),
        (0, "accuracy 0.97"),
        (None, "--- mpirun's own report"),
        (0, "warning"),
        (1, "dying mid-line"),
        (3, "boom"),
    ]
    report = "mpirun noticed that process rank 1 with PID 77 on node w1 exited on signal 9 (Killed)."
    assert mpirun.failed_rank(report) == "rank 1 on w1 was killed by signal 9"
    assert mpirun.failed_rank("all good") is None
    exit_report = "The first process to do so was:\n\n  Process name: [[20259,1],0]\n  Exit code:    1\n"
    assert mpirun.failure_summary(exit_report, 1, ranks={0, 1}, collateral={0}) == (
        "rank 1 left the job first; ranks 0 were stopped by Horovod as a result (rank 0 exited with code 1)"
    )
    assert mpirun.failure_summary(exit_report, 1, ranks={0, 1}, collateral=()) == "rank 0 exited with code 1"
    assert mpirun.failure_summary("", 7, ranks={0}, collateral=()) == "mpirun exited with code 7"


def test_the_closing_line_names_the_exception_a_rank_raised_and_why_horovodrun_stopped() -> None:
    errors = mpirun.RankErrors()
    for rank, text in [
        (0, "Traceback (most recent call last):"), (0, '  File "t.py", line 3, in <module>'), (0, "    boom()"),
        (0, "tensorflow.python.framework.errors_impl.UnknownError: Graph execution error:"), (0, ""),
        (0, "Detected at node DistributedSGD/cond/DistributedSGD.0 defined at (most recent call last):"),
        (1, "Epoch 3/12: 40%"),
    ]:  # fmt: skip
        errors.feed(rank, text)
    assert errors.errors == {0: "tensorflow.python.framework.errors_impl.UnknownError: Graph execution error:"}
    # horovodrun's own closing lines (horovod/runner/gloo_run.py, elastic/registration.py) after a one-host
    # elastic job lost a worker: the driver blacklists the host, and with it every slot
    driver = ("Process 1 exit with status code 137.\nERROR:root:blacklisted slots count == 2 -> stop running\n"
              "RuntimeError: Horovod detected that one or more processes exited with non-zero status, thus causing "
              "the job to be terminated. The first process to do so was:\nProcess name: localhost[1]\nExit code: 137\n")
    assert mpirun.failure_summary(driver, 1, ranks={0, 1}, collateral=(), launcher="horovodrun") == (
        "worker process 1 was killed by signal 9; Horovod's elastic driver stopped the job: it blacklists the whole "
        "host of a failed worker, and no host was left; list each slot under a host name of its own "
        "(e.g. localhost:1 and 127.0.0.1:1) to keep the others"
    )
    script_bug = "Process 0 exit with status code 1.\nERROR:root:failure count == 1 -> stop running\n"
    assert mpirun.failure_summary(script_bug, 1, ranks={0}, collateral=(), errors={0: "ValueError: bad record 17"},
                                  launcher="horovodrun") == "rank 0 raised ValueError: bad record 17"
    assert mpirun.failure_summary("", 1, ranks={0}, collateral=(), launcher="horovodrun") == "horovodrun exited with code 1"
