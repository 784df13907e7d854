"""Shared fixtures: run the real ``hvdk8s`` CLI (and so real mpirun) in a subprocess."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import tomllib
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = Path(__file__).resolve().parent / "mpi_scripts"
HVDK8S = str(Path(sys.executable).parent / "hvdk8s")


def package_dirs() -> dict[str, str]:
    """pyproject's ``package-dir`` (import name -> folder in the checkout): where the tests find the package's
    sources. Read here, not through scripts/mkdocs_hooks.py, so that the tests do not depend on the docs build."""
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]


# Test material written elsewhere, kept beside the checkout and never in it: the CRD schemas, peers' own test
# suites and examples, measurements. CI has it; a clone without it skips the tests that need it, by name.
SHARED = REPO.parent / "shared"
_SHARED_ORIGIN = {
    "schemas": "the controllers' real CRDs, from their upstream repositories (listed in schemas/SOURCES.md)",
    "peer/horovod": "Horovod's own test file and examples, github.com/horovod/horovod v0.28.1 (Apache-2.0)",
    "peer/tfserving": "TensorFlow Serving's own server tests and testdata, github.com/tensorflow/serving",
    "measurements": "measurements taken for this project",
}


def shared_missing(relative: str) -> str | None:
    """Why ``../shared/RELATIVE`` cannot be used (one line naming it and where it comes from), or None if present."""
    path = SHARED / relative
    if path.exists():
        return None
    origin = next((v for k, v in _SHARED_ORIGIN.items() if relative == k or relative.startswith(k + "/")), "")
    return f"needs ../shared/{relative} beside the checkout ({origin or 'peer test material'}); absent here"


def shared(relative: str) -> Path:
    """``../shared/RELATIVE``, or skip the calling test with ``shared_missing``'s line."""
    reason = shared_missing(relative)
    if reason:
        pytest.skip(reason)
    return SHARED / relative


def needs_shared(*relatives: str) -> pytest.MarkDecorator:
    """A mark (for ``pytestmark`` or one test) that skips unless every ``../shared/RELATIVE`` is present."""
    reasons = [r for r in map(shared_missing, relatives) if r]
    return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons))


# Reasons given by ``skip_after_call`` during the running test's call (one test at a time per process).
_SKIP_AFTER_CALL: list[str] = []


def skip_after_call(reason: str) -> None:
    """Skip the running test when its body ends, whatever it did: for material found absent on another thread of
    this process (a test double's server thread, where ``shared`` raises into the server instead of the test)."""
    _SKIP_AFTER_CALL.append(reason)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call() -> Generator[None, object, object]:
    """Turn the call's outcome into ``skip_after_call``'s skip, if one was asked for during it: a test that needed
    absent material can neither pass nor fail."""
    _SKIP_AFTER_CALL.clear()
    try:
        return (yield)
    finally:
        if _SKIP_AFTER_CALL:
            pytest.skip(_SKIP_AFTER_CALL[0])


@pytest.fixture(autouse=True)
def _cli_leaves_the_log_level_alone() -> Iterator[None]:
    """Restore TensorFlow's log level after each test: ``hvdk8s.cli.main`` sets it in its process's environment
    (``quiet.quiet_tensorflow``), as a command should, and many tests call ``main`` in this process."""
    names = ("TF_CPP_MIN_LOG_LEVEL", "HVDK8S_VERBOSE")
    before = {name: os.environ.get(name) for name in names}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def hvdk8s_cli(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``hvdk8s ARGS`` from the repo root; fail the test with its output on error."""
    proc = subprocess.run(
        [HVDK8S, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=job_env()
    )
    if check and proc.returncode != 0:
        pytest.fail(f"hvdk8s {' '.join(args)} exited {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}")
    return proc


def job_env() -> dict[str, str]:
    """The environment for jobs under test: ephemeral metrics ports, so runs never collide."""
    return {**os.environ, "HVDK8S_METRICS_PORT": "0"}


def output_of(job: subprocess.Popen[str], total: float = 300, silence: float = 120) -> Iterator[str]:
    """``job``'s output lines as they come. A hung job fails its test instead of hanging the suite: ``job``
    (started with ``start_new_session=True``) is killed with its process group (horovodrun or mpirun and the
    ranks) after ``total`` seconds, after ``silence`` seconds without a line, or at once when the reader stops
    early (the test failed), so that ``Popen``'s exit, which waits, returns."""
    def kill() -> None:
        try:
            os.killpg(job.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # ended meanwhile

    def kill_after(seconds: float) -> threading.Timer:
        timer = threading.Timer(seconds, kill)
        timer.start()
        return timer

    assert job.stdout is not None
    deadline, quiet = kill_after(total), kill_after(silence)
    try:
        for line in job.stdout:
            quiet.cancel()
            quiet = kill_after(silence)
            yield line
        job.wait()
    finally:
        deadline.cancel()
        quiet.cancel()
        if job.poll() is None:
            kill()


def run_ranks(np: int, script: str, *args: str, **kw) -> subprocess.CompletedProcess[str]:
    """Launch ``tests/mpi_scripts/SCRIPT`` on ``np`` ranks through ``hvdk8s run``."""
    return hvdk8s_cli("run", "-np", str(np), str(SCRIPTS / script), *args, **kw)


def discovery_script(tmp_path: Path, hosts: str) -> tuple[Path, Path]:
    """An elastic host-discovery script that prints ``hosts.txt``; write that file to change the offer."""
    hosts_file = tmp_path / "hosts.txt"
    hosts_file.write_text(hosts)
    script = tmp_path / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts_file}\n")
    script.chmod(0o755)
    return hosts_file, script


# Modules whose hosts are network namespaces on one subnet (chaos and the elastic MPIJob: 10.214.0) or that mount
# over /root/.ssh (multi-host pods): under pytest-xdist they share one worker, one after another. test_benchmarks'
# emulated cluster has its own prefix and subnet (hvbench-, 10.213.0) and no ssh, so it runs beside them.
NETNS_MODULES = {"test_chaos", "test_mpijob_elastic", "test_multihost"}


def pytest_configure(config: pytest.Config) -> None:
    """Register pytest-xdist's mark, which the hook below adds, also where xdist is not installed (a stack's venv
    run by hand), so that it does not warn there."""
    config.addinivalue_line("markers", "xdist_group(name): tests that one pytest-xdist worker runs one after another")


# The groups that take longest (minutes each: MPI jobs and benchmark runs one after another), longest first, as
# pytest --durations showed them, the e2e scenarios' (``make test-e2e``) and then the rest's (``make test``): both
# start them first (``--no-loadscope-reorder`` keeps this order; pytest-xdist would otherwise start the groups with
# the most tests first), so that the many short modules fill the other worker meanwhile instead of a long one
# running alone at the end.
LONG_FIRST = (*sorted(NETNS_MODULES), "test_benchmarks", "test_synthetic_peer", "test_cluster_bench_e2e",
              "test_tfserving_peer", "test_horovod_api", "test_migrate_examples", "test_elastic", "test_checkpoint",
              "test_resume_h5", "test_training", "test_installed")


def _module(item: pytest.Item) -> str:
    return item.nodeid.split("::")[0].rsplit("/", 1)[-1].removesuffix(".py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put LONG_FIRST's modules first, in its order; the rest keep theirs. The same order on every xdist worker."""
    rank = {module: i for i, module in enumerate(LONG_FIRST)}
    items.sort(key=lambda item: rank.get(_module(item), len(rank)))


def pytest_itemcollected(item: pytest.Item) -> None:
    """One xdist group per module, so that a worker builds a module's fixtures (often a whole MPI job) only once;
    one group for all of NETNS_MODULES. Marked as each test is collected, before pytest-xdist's worker reads the
    groups (its ``pytest_collection_modifyitems``). Without ``-n`` the marks change nothing."""
    module = _module(item)
    item.add_marker(pytest.mark.xdist_group("netns" if module in NETNS_MODULES else module))
