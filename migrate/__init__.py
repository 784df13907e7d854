"""``hvdk8s migrate``: a tool that ports Horovod Keras 2 scripts to hvdk8s on Keras 3, not part of the training core.

    from hvdk8s.migrate import migrate_source
    result = migrate_source(open("train.py").read(), "train.py")
    print(result.code); print(result.findings)    # what is left to do by hand, with lines

The codemod needs libcst, an optional extra (``pip install 'hvdk8s[migrate]'``). Names load on
first use, written once, as imports, in ``__init__.pyi`` (``lazy_loader``), so the command line
can register ``hvdk8s migrate`` without libcst and say what to install when it runs.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
