"""Models for the serving tests (the server itself: ``hvdk8s.serving.server.process.running``)."""
from __future__ import annotations

import sys
from pathlib import Path

CLI = [sys.executable, "-m", "hvdk8s.cli"]  # the CLI as users run it, in a subprocess


def export_untrained(base: Path) -> Path:
    """An untrained digits CNN as version 1 of ``base``: real signatures, no training time."""
    import keras

    from hvdk8s import models, serving

    keras.utils.set_random_seed(0)
    return serving.export(models.cnn("cnn", seed=0), base, class_names=[str(i) for i in range(10)])
