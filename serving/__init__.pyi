"""The public names of ``hvdk8s.serving``, for editors and type checkers; ``__init__.py`` loads each on first use."""

from .clients.rest_client import PredictError as PredictError, predict as predict
from .model.savedmodel import (
    export as export,
    next_version as next_version,
    read_metadata as read_metadata,
    versions as versions,
)
from .model.selection import evaluate as evaluate, select as select
from .server.app import create_app as create_app, serve as serve
