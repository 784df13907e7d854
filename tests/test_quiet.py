"""TensorFlow's start-up lines are off by default in every hvdk8s command, on with ``--verbose``."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdk8s.common.quiet import QUIET_LEVEL, TF_LOG_LEVEL, VERBOSE, quiet_tensorflow

from conftest import HVDK8S, REPO


def test_quiet_sets_errors_only_unless_the_user_chose() -> None:
    env: dict[str, str] = {}
    quiet_tensorflow(env)
    assert env == {TF_LOG_LEVEL: QUIET_LEVEL}
    chosen = {TF_LOG_LEVEL: "0"}
    quiet_tensorflow(chosen)
    assert chosen == {TF_LOG_LEVEL: "0"}


def test_verbose_flag_or_variable_leaves_tensorflow_its_default() -> None:
    flagged: dict[str, str] = {}
    quiet_tensorflow(flagged, verbose=True)
    assert flagged == {VERBOSE: "1"}  # marked, so ranks and nested commands stay verbose
    for value in ("1", "true", "yes"):
        env = {VERBOSE: value}
        quiet_tensorflow(env)
        assert TF_LOG_LEVEL not in env
    env = {VERBOSE: "0"}
    quiet_tensorflow(env)
    assert env[TF_LOG_LEVEL] == QUIET_LEVEL


def _messages(argv: list[str]) -> set[str]:
    """The lines a process writes, without the glog prefix (level, time, thread, file:line) or mpirun's tag."""
    env = {k: v for k, v in os.environ.items() if k not in (TF_LOG_LEVEL, VERBOSE)}
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = (run.stdout + run.stderr).splitlines()
    return {line.rsplit("] ", 1)[-1] for line in lines if line.strip()}


def test_ranks_print_none_of_tensorflows_start_up_lines(tmp_path: Path) -> None:
    """Whatever a bare TensorFlow import prints on this machine, a rank launched by ``hvdk8s run`` does not
    print by default and does with ``--verbose``."""
    bare = _messages([sys.executable, "-c", "import tensorflow"])
    if not bare:
        pytest.skip("a bare TensorFlow import printed nothing on this machine: nothing to hide")
    script = tmp_path / "imports_tensorflow.py"
    script.write_text("import tensorflow\n")
    assert not bare & _messages([HVDK8S, "run", "-np", "1", str(script)])
    assert bare <= _messages([HVDK8S, "--verbose", "run", "-np", "1", str(script)])
