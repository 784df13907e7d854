"""Version tracking of the local server (serving/server/repository.py) with a stand-in loader."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hvdk8s.serving.api.types import ServingError
from hvdk8s.serving.server.registry import ConfigWatcher, Models, read_model_config
from hvdk8s.serving.server.repository import ModelRepository, Servable, VersionPolicy

pytestmark = pytest.mark.unit


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


def states(repo: ModelRepository, name: str = "digits") -> dict[int, tuple[str, str]]:
    return {v: (state, code) for v, state, code, _ in repo.status(name)}


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


def test_zero_padded_version_folders_load_from_their_own_folder(tmp_path):
    """TF Serving's testdata (and many model repositories) name versions 00000123: version 123, loaded from there."""
    loader = Loader()
    (tmp_path / "00000123").mkdir()
    (tmp_path / "00000123" / "saved_model.pb").write_text("ok")
    repo = ModelRepository(tmp_path, "half_plus_two", loader=loader)
    repo.poll()
    assert {v: s for v, s, _, _ in repo.status("half_plus_two")} == {123: "AVAILABLE"}
    assert repo.get("half_plus_two", 123).path == tmp_path / "00000123"


@pytest.mark.parametrize(
    "policy, served",
    [
        (VersionPolicy("latest", 2), {2, 3}),
        (VersionPolicy("all"), {1, 2, 3}),
        (VersionPolicy("specific", versions=(1, 3, 9)), {1, 3}),
    ],
)
def test_version_policies_as_in_tf_serving(tmp_path, policy, served):
    for version in (1, 2, 3):
        write_version(tmp_path, version)
    repo = ModelRepository(tmp_path, "digits", loader=Loader(), policy=policy)
    repo.poll()
    assert repo.available() == served


def test_model_config_file_serves_several_models_and_reloads(tmp_path):
    for name in ("a", "b"):
        write_version(tmp_path / name, 1)
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "a" base_path: "{tmp_path / "a"}" }} '
                      f'config {{ name: "b" base_path: "{tmp_path / "b"}" version_labels {{ key: "stable" value: 1 }} }} }}')
    models = Models(read_model_config(config), loader=Loader())
    watcher = ConfigWatcher(config, models, seconds=0.001)
    models.poll()
    assert models.get("a").version == 1 and models.get("b", label="stable").version == 1
    with pytest.raises(ServingError, match="Unrecognized servable version label: stable"):
        models.get("a", label="stable")

    config.write_text("model_config_list { config { name: \"b\" base_path: \"%s\" } }" % (tmp_path / "b"))
    time.sleep(0.01)  # past the watcher's period
    watcher.check()
    models.poll()
    assert models.names == ["b"]
    with pytest.raises(ServingError, match=r"Servable not found for request: Latest\(a\)"):
        models.get("a")

    config.write_text("improperly formatted file")  # not reloaded: the models stay as they are
    time.sleep(0.01)
    watcher.check()
    assert models.names == ["b"]
    with pytest.raises(ValueError, match="Error parsing text-format tensorflow.serving.ModelServerConfig"):
        read_model_config(config)


class Cyclic:
    """A model's objects as TensorFlow leaves them: freed by the cyclic collector only."""

    def __init__(self) -> None:
        self.me = self


def test_freezer_frees_the_versions_unloaded_or_replaced_since_it_last_froze(tmp_path):
    """A swapped base path or a deleted version left ``loads`` unchanged: the old model stayed pinned in the
    permanent generation (its memory never freed) and the new one was never frozen."""
    import gc
    import weakref

    from hvdk8s.serving.server.app import ModelFreezer
    from hvdk8s.serving.server.registry import ModelConfig

    def loader(version: int, path: Path) -> Servable:
        return Servable(version, path, {}, {}, {}, loaded=Cyclic())

    for base in ("a", "b"):
        write_version(tmp_path / base, 1)
    models = Models([ModelConfig("m", tmp_path / "a")], loader=loader)
    freeze = ModelFreezer(models)
    try:
        models.poll()
        freeze()
        first = weakref.ref(models.get("m").loaded)
        models.configure([ModelConfig("m", tmp_path / "b", VersionPolicy("latest", 2))])  # another base path
        models.poll()
        freeze()
        assert first() is None, "the replaced model is still held"
        replacement = models.get("m").loaded
        assert gc.is_tracked(replacement) and all(o is not replacement for o in gc.get_objects()), "not frozen"
        del replacement

        write_version(tmp_path / "b", 2)
        models.poll()
        freeze()
        newest = weakref.ref(models.get("m").loaded)
        (tmp_path / "b" / "2" / "saved_model.pb").unlink()
        (tmp_path / "b" / "2").rmdir()
        models.poll()  # version 2 deleted: unloaded, nothing loaded
        freeze()
        assert newest() is None, "the deleted version is still held"
    finally:
        gc.unfreeze()


def test_a_changed_version_policy_keeps_the_model_serving_its_loaded_versions(tmp_path):
    """TF Serving only changes which versions it aspires; the model was rebuilt and answered NOT_FOUND until the
    next poll, then loaded every version again."""
    from hvdk8s.serving.server.registry import ModelConfig

    for version in (1, 2):
        write_version(tmp_path, version)
    loader = Loader()
    models = Models([ModelConfig("m", tmp_path)], loader=loader)
    models.poll()
    models.configure([ModelConfig("m", tmp_path, VersionPolicy("latest", 2))])
    assert models.get("m").version == 2  # before the next poll too
    models.poll()
    assert (models.get("m", 1).version, models.get("m").version, loader.calls) == (1, 2, [2, 1])

    models.configure([ModelConfig("m", tmp_path, VersionPolicy("specific", versions=(1,)))])
    models.poll()
    assert states(models.repositories()[0], "m") == {1: ("AVAILABLE", "OK"), 2: ("END", "OK")}
    assert loader.calls == [2, 1]


@pytest.mark.parametrize("copying", ["variables.index", "variables.data-00000-of-00001"])
def test_a_failed_version_is_retried_when_its_variables_finish_copying(tmp_path, copying):
    """Only the folder's and saved_model.pb's mtimes counted: a file of variables/ that appeared (or was still
    being written) after the first try left the version failed for good."""
    def loader(version: int, path: Path) -> Servable:
        if not all((path / "variables" / name).stat().st_size for name in files):
            raise ValueError("variables: truncated")
        return Servable(version, path, {}, {}, {}, loaded=None)

    files = ["variables.index", "variables.data-00000-of-00001"]
    write_version(tmp_path, 1)
    variables = tmp_path / "1" / "variables"
    variables.mkdir()
    for name in files:
        (variables / name).write_text("x" if name != copying else "")
        os.utime(variables / name, ns=(0, 0))
    os.utime(variables, ns=(0, 0))
    repo = ModelRepository(tmp_path, "digits", loader=loader)
    repo.poll()
    assert states(repo) == {1: ("END", "UNKNOWN")}

    (variables / copying).write_text("x")  # the copy finishes: the version folder and saved_model.pb unchanged
    repo.poll()
    assert states(repo) == {1: ("AVAILABLE", "OK")}


def test_a_failed_version_is_retried_5_times_a_minute_apart_as_in_tf_serving(tmp_path):
    """--max_num_load_retries 5, --load_retry_interval_micros 60 s (model_servers/server.h), files unchanged."""
    now = [0.0]
    loader = Loader()
    write_version(tmp_path, 1, "broken")
    repo = ModelRepository(tmp_path, "digits", loader=loader, clock=lambda: now[0])
    repo.poll()
    for _ in range(8):
        repo.poll()  # not yet due
        now[0] += 59
        repo.poll()
        now[0] += 1
    assert loader.calls == [1] * 6 and states(repo) == {1: ("END", "UNKNOWN")}

    write_version(tmp_path, 1, "fixed")  # its files changed: loaded at once
    repo.poll()
    assert loader.calls == [1] * 7 and states(repo) == {1: ("AVAILABLE", "OK")}


def test_a_model_config_that_is_not_utf8_is_logged_in_one_line_and_the_models_stay(tmp_path, caplog):
    """The UnicodeDecodeError escaped the watcher: a traceback every poll, and that poll's scan skipped."""
    write_version(tmp_path / "a", 1)
    config = tmp_path / "models.config"
    config.write_text(f'model_config_list {{ config {{ name: "a" base_path: "{tmp_path / "a"}" }} }}')
    models = Models(read_model_config(config), loader=Loader())
    watcher = ConfigWatcher(config, models, seconds=0.001)
    config.write_bytes(b'model_config_list { config { name: "\xff" } }')
    time.sleep(0.01)  # past the watcher's period
    watcher.check()
    assert models.names == ["a"]
    assert [(r.levelname, r.getMessage(), r.exc_info) for r in caplog.records] == [
        ("ERROR", f"model config not reloaded, serving the previous one: --model_config_file {config}: "
                  "not UTF-8 text (byte 36)", None)]
