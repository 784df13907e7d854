"""hvdk8s.common.atomic: the one atomic writer every layer uses."""
from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from hvdk8s.common import atomic

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


@pytest.mark.parametrize("renameat2", [True, False], ids=["renameat2", "check-then-rename"])
def test_a_directory_never_replaces_an_empty_folder_made_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, renameat2: bool) -> None:
    # rename(2) replaces an existing empty folder; an operator's `mkdir base/3` or another writer's must stay
    if not renameat2:  # as on a system without it
        monkeypatch.setattr(atomic, "_renameat2", lambda: None)
    elif atomic._renameat2() is None:
        pytest.skip("this C library has no renameat2")
    final = tmp_path / "3"
    with pytest.raises(FileExistsError, match=f"File exists: '{final}'"), atomic.atomic_directory(final) as tmp:
        (tmp / "saved_model.pb").write_text("x")
        os.mkdir(final)  # made while the writer was filling its temporary
    assert [p.name for p in tmp_path.iterdir()] == ["3"] and list(final.iterdir()) == []


def test_a_directory_s_files_are_on_disk_before_it_appears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[tuple[str, bool]] = []
    fsync = atomic._fsync
    final = tmp_path / "1"

    def spy(path: Path) -> None:
        fsync(path)
        synced.append((os.path.relpath(path, tmp_path).split("/", 1)[-1], final.exists()))

    monkeypatch.setattr(atomic, "_fsync", spy)
    with atomic.atomic_directory(final) as tmp:
        (tmp / "variables").mkdir()
        (tmp / "variables" / "variables.index").write_text("i")
        (tmp / "saved_model.pb").write_text("x")
        os.symlink("saved_model.pb", tmp / "link")  # not followed, not synced twice
    # every file and folder of the temporary before the rename, then the parent (its new entry) after
    before = sorted(name for name, appeared in synced if not appeared)
    assert before == sorted([tmp.name, "saved_model.pb", "variables", "variables/variables.index"])
    assert synced[-1] == (".", True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_link_is_followed_and_stays_a_link(tmp_path: Path) -> None:
    (tmp_path / "real.yaml").write_text("old\n")
    (tmp_path / "link.yaml").symlink_to("real.yaml")
    atomic.write_text(tmp_path / "link.yaml", "new\n")
    assert (tmp_path / "link.yaml").is_symlink() and os.readlink(tmp_path / "link.yaml") == "real.yaml"
    assert (tmp_path / "real.yaml").read_text() == "new\n"


def test_a_folder_or_a_fifo_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A rename would replace them (as root, also a device such as /dev/stdout); a FIFO stands for every such file."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "folder").mkdir()
    with pytest.raises(OSError, match="not a regular file") as fifo:
        atomic.write_text(tmp_path / "fifo", "x")
    with pytest.raises(IsADirectoryError) as folder:
        atomic.write_text(tmp_path / "folder", "x")
    assert (fifo.value.filename, folder.value.filename) == (str(tmp_path / "fifo"), str(tmp_path / "folder"))
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and sorted(os.listdir(tmp_path)) == ["fifo", "folder"]


def test_the_cli_names_a_path_it_cannot_write_and_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No traceback: the path and the system's reason, whichever command writes it."""
    import hvdk8s.cli

    (tmp_path / "afile").write_text("")
    (tmp_path / "adir").mkdir()
    code = hvdk8s.cli.main(["pipeline", "ingest", "--source", "digits", "--out", str(tmp_path / "afile" / "x.npz")])
    assert (code, capsys.readouterr().err) == (2, f"hvdk8s pipeline: error: {tmp_path / 'afile'}: Not a directory\n")
    code = hvdk8s.cli.main(["pipeline", "ingest", "--source", "digits", "--out", str(tmp_path / "adir")])
    assert (code, capsys.readouterr().err) == (2, f"hvdk8s pipeline: error: {tmp_path / 'adir'}: Is a directory\n")
