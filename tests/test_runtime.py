"""Process-level helpers that need no MPI job."""
import pytest

from hvdk8s.runtime import placement

pytestmark = pytest.mark.unit


def test_placement_counts_ranks_per_host_sorted() -> None:
    assert placement(["b", "a", "b", "a"]) == "4 ranks on 2 hosts (a: 2, b: 2)"
    assert placement(["solo"]) == "1 rank on 1 host (solo: 1)"
    assert placement(["w1", "w0", "w1"]) == "3 ranks on 2 hosts (w0: 1, w1: 2)"


def test_exported_names_stay_functions_after_their_modules_are_imported() -> None:
    import importlib
    import pkgutil

    import hvdk8s

    first = {name: getattr(hvdk8s, name) for name in hvdk8s.__all__}
    for module in pkgutil.iter_modules(hvdk8s.__path__):
        importlib.import_module(f"hvdk8s.{module.name}")  # a submodule import binds its name on the package
    changed = {name: getattr(hvdk8s, name) for name, value in first.items() if getattr(hvdk8s, name) is not value}
    assert not changed, f"rebound by a submodule import: {changed}"


def test_each_rank_gets_its_own_gpu_and_more_ranks_than_gpus_is_refused(monkeypatch) -> None:
    """No GPU here: TensorFlow's device list and Horovod's local rank/size are stubbed, the pinning is real."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from hvdk8s import runtime
    from hvdk8s.common.errors import UserError

    pinned: list[tuple[str, object]] = []
    monkeypatch.setattr(tf.config, "list_physical_devices", lambda kind: ["GPU:0", "GPU:1"] if kind == "GPU" else [])
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda gpu, on: pinned.append(("growth", gpu)))
    monkeypatch.setattr(tf.config, "set_visible_devices", lambda gpu, kind: pinned.append(("visible", gpu)))
    monkeypatch.setattr(hvd, "local_size", lambda: 2)
    monkeypatch.setattr(hvd, "local_rank", lambda: 1)
    runtime._set_devices(None)
    assert pinned == [("growth", "GPU:1"), ("visible", "GPU:1")]

    pinned.clear()
    monkeypatch.setattr(hvd, "local_size", lambda: 3)
    monkeypatch.setattr(hvd, "local_rank", lambda: 0)  # every rank of the host refuses, not only the third
    with pytest.raises(UserError) as refused:
        runtime._set_devices(None)
    assert str(refused.value).startswith("3 ranks on this host but 2 GPU(s) visible to them: hvdk8s gives each rank "
                                         "its own GPU. Start at most 2 rank(s) per host: fewer ranks (hvdk8s run -np")
    assert "slotsPerWorker" in str(refused.value) and pinned == []


@pytest.mark.parametrize("threads, error, message", [
    ("2", TypeError, "threads_per_rank: expected a whole number, got str '2'"),
    (2.5, TypeError, "threads_per_rank: expected a whole number, got float 2.5"),
    (-1, ValueError, "threads_per_rank=-1: must be >= 1"),
    (0, ValueError, "threads_per_rank=0: must be >= 1"),
])
def test_init_refuses_a_bad_thread_count_before_horovod_starts(monkeypatch, threads, error, message) -> None:
    """Before: a TypeError from deep inside once Horovod was up (without the pinning), or the value ignored."""
    import horovod.tensorflow as hvd

    from hvdk8s import runtime

    started: list[object] = []
    monkeypatch.setattr(hvd, "init", lambda **kwargs: started.append(kwargs))
    monkeypatch.setattr(hvd, "is_initialized", lambda: False)
    with pytest.raises(error) as refused:
        runtime.init(threads_per_rank=threads, quiet=True)
    assert str(refused.value) == message and started == []
