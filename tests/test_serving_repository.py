"""Version tracking of the local server (serving/repository.py) with a stand-in loader."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from hvdk8s.serving.repository import ModelRepository, Servable
from hvdk8s.serving.rest import ServingError


class Loader:
    """Loads any folder with a saved_model.pb whose text is not "broken"; records the calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, version: int, path: Path) -> Servable:
        self.calls.append(version)
        if (path / "saved_model.pb").read_text() == "broken":
            raise ValueError("cannot parse saved_model.pb")
        return Servable(version, path, {}, {}, {}, loaded=None)


def write_version(base: Path, version: int, content: str = "ok") -> None:
    (base / str(version)).mkdir(parents=True, exist_ok=True)
    pb = base / str(version) / "saved_model.pb"
    pb.write_text(content)
    os.utime(pb, ns=(version * 10**9 + len(content), version * 10**9 + len(content)))  # distinct stamps


def states(repo: ModelRepository) -> dict[int, tuple[str, str]]:
    return {v: (state, code) for v, state, code, _ in repo.status("digits")}


def test_newest_version_replaces_the_old_one_only_once_it_loads(tmp_path):
    loader = Loader()
    repo = ModelRepository(tmp_path, "digits", loader=loader)
    with pytest.raises(ServingError, match="Could not find any versions of model digits"):
        repo.status("digits")
    write_version(tmp_path, 1)
    (tmp_path / ".tmp-2-abc").mkdir()  # an export in progress is not a version
    repo.poll()
    assert states(repo) == {1: ("AVAILABLE", "OK")} and repo.get("digits").version == 1

    write_version(tmp_path, 2, "broken")
    repo.poll()
    repo.poll()  # a failed version is not retried while its files are unchanged
    assert loader.calls == [1, 2]
    assert states(repo) == {1: ("AVAILABLE", "OK"), 2: ("END", "UNKNOWN")}
    assert "cannot parse saved_model.pb" in repo.status("digits", 2)[0][3]
    assert repo.get("digits").version == 1  # the broken version never took the model offline

    write_version(tmp_path, 2, "fixed")
    repo.poll()
    assert loader.calls == [1, 2, 2]
    assert states(repo) == {1: ("END", "OK"), 2: ("AVAILABLE", "OK")}
    assert repo.get("digits").version == 2 and repo.get("digits", 2).version == 2
    with pytest.raises(ServingError, match=r"Servable not found for request: Specific\(digits, 1\)"):
        repo.get("digits", 1)
    with pytest.raises(ServingError, match=r"Latest\(mnist\)"):
        repo.get("mnist")


def test_keeps_the_newest_n_and_follows_deletions(tmp_path):
    for version in (1, 2, 3):
        write_version(tmp_path, version)
    repo = ModelRepository(tmp_path, "digits", num_versions=2, loader=Loader())
    repo.poll()
    assert states(repo) == {2: ("AVAILABLE", "OK"), 3: ("AVAILABLE", "OK")}
    assert repo.get("digits", 2).version == 2 and repo.get("digits").version == 3

    (tmp_path / "3" / "saved_model.pb").unlink()
    (tmp_path / "3").rmdir()
    repo.poll()  # version 3 deleted: unloaded, and version 1 comes back as one of the newest two
    assert states(repo) == {1: ("AVAILABLE", "OK"), 2: ("AVAILABLE", "OK"), 3: ("END", "OK")}
    assert repo.get("digits").version == 2
    with pytest.raises(ServingError, match="Could not find version 7 of model digits"):
        repo.status("digits", 7)
