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
