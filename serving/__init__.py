"""Serving: TensorFlow Serving export, model selection, a local REST + gRPC server, clients, load tests.

    from hvdk8s import serving
    serving.export(model, "models/digits", class_names=[str(i) for i in range(10)])
    serving.select("candidates/", "models/digits")       # best candidate -> next version
    serving.serve("models/digits", port=8501)            # TF Serving's REST (and gRPC, 8500) APIs, blocks
    serving.predict("http://127.0.0.1:8501", [png_bytes], model="digits")
    hvdk8s.serving.loadtest.run("http://127.0.0.1:8501", "digits", concurrency=8, requests=1000).to_dict()

Names load on first use, so importing this package (as the manifest
commands do) pulls in neither TensorFlow nor the web server.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "export": "hvdk8s.serving.savedmodel",
    "versions": "hvdk8s.serving.savedmodel",
    "next_version": "hvdk8s.serving.savedmodel",
    "read_metadata": "hvdk8s.serving.savedmodel",
    "select": "hvdk8s.serving.selection",
    "evaluate": "hvdk8s.serving.selection",
    "serve": "hvdk8s.serving.server",
    "create_app": "hvdk8s.serving.server",
    "predict": "hvdk8s.serving.client",
    "PredictError": "hvdk8s.serving.client",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'hvdk8s.serving' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
