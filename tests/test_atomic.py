"""hvdk8s.atomic: the one atomic writer every layer uses."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hvdk8s import atomic

pytestmark = pytest.mark.unit


def test_write_replaces_the_file_with_open_s_mode_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "job.yaml"
    atomic.write_text(target, "a: 1\n")
    atomic.write_text(target, "a: 2\n")
    assert target.read_text() == "a: 2\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    assert sorted(p.name for p in target.parent.iterdir()) == ["job.yaml"]
    atomic.write_json(tmp_path / "r.json", {"x": [1]})
    assert json.loads((tmp_path / "r.json").read_text()) == {"x": [1]}


def test_a_failed_write_keeps_the_old_file_and_removes_its_temporary(tmp_path: Path) -> None:
    target = tmp_path / "model.keras"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic.atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.suffix == ".keras" and tmp.name.startswith(atomic.TEMP_PREFIX)
        tmp.write_text("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.keras"]


def test_a_named_temporary_is_used_and_must_be_hidden(tmp_path: Path) -> None:
    seen = []
    with atomic.atomic_path(tmp_path / "ckpt-0001.keras", temporary=".tmp-host-7-ckpt-0001.keras") as tmp:
        seen.append(tmp.name)
        tmp.write_text("zip")
    assert seen == [".tmp-host-7-ckpt-0001.keras"] and [p.name for p in tmp_path.iterdir()] == ["ckpt-0001.keras"]
    with pytest.raises(ValueError, match="must be a file name starting with '.tmp-'"), \
            atomic.atomic_path(tmp_path / "x", temporary="x.part"):
        pass


def test_a_directory_appears_whole_and_never_merges_into_an_existing_one(tmp_path: Path) -> None:
    with atomic.atomic_directory(tmp_path / "1") as tmp:
        (tmp / "saved_model.pb").write_text("x")
        assert not (tmp_path / "1").exists()
    assert (tmp_path / "1" / "saved_model.pb").read_text() == "x"
    with pytest.raises(OSError), atomic.atomic_directory(tmp_path / "1") as tmp:
        (tmp / "other").write_text("y")
    assert sorted(p.name for p in (tmp_path / "1").iterdir()) == ["saved_model.pb"]
    assert [p.name for p in tmp_path.iterdir()] == ["1"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
