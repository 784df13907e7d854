"""The public names of ``hvdk8s.migrate``, for editors and type checkers; ``__init__.py`` loads each on first use."""

from .codemod import LOSS_ALIASES as LOSS_ALIASES, Finding as Finding, Result as Result, migrate_source as migrate_source
