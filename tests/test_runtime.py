"""Process-level helpers that need no MPI job."""
from hvdk8s.runtime import placement


def test_placement_counts_ranks_per_host_sorted() -> None:
    assert placement(["b", "a", "b", "a"]) == "4 ranks on 2 hosts (a: 2, b: 2)"
    assert placement(["solo"]) == "1 rank on 1 host (solo: 1)"
    assert placement(["w1", "w0", "w1"]) == "3 ranks on 2 hosts (w0: 1, w1: 2)"


def test_exported_names_stay_functions_after_their_modules_are_imported() -> None:
    import importlib

    import hvdk8s

    for name, module in hvdk8s._EXPORTS.items():
        first = getattr(hvdk8s, name)
        importlib.import_module(module)  # a submodule import binds its name on the package
        assert getattr(hvdk8s, name) is first, f"hvdk8s.{name} became {getattr(hvdk8s, name)!r}"
