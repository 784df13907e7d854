"""A SavedModel exported on the default stack loads and answers its signatures under the oldest supported
TensorFlow (issue #37).

The TF Serving a user deploys can be older than the TensorFlow that exported the model (``serving-manifests
--tf-serving-version``, a cluster's pinned image), down to the oldest stack this project supports. The export
runs in the default stack's virtual environment (``.venv``, made by ``make setup``), the load and the calls in
the oldest stack's (``.venv-tf<oldest>``, made by ``make test-stack TF=<oldest>``), each in its own process;
the loading side is plain TensorFlow, tag ``serve``, as TF Serving loads it: neither hvdk8s nor Keras.
Both run whichever of the two stacks runs this test, so ``make test-stack`` runs it once the oldest stack's
environment exists, and ``make test`` too where it does.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO

STACKS = sorted((p.stem.removeprefix("tf-") for p in (REPO / "scripts" / "stacks").glob("tf-*.txt")),
                key=lambda v: tuple(map(int, v.split("."))))
DEFAULT_STACK = re.search(r"TF_STACK=\$\{HVDK8S_TF:-([\d.]+)\}", (REPO / "scripts" / "setup.sh").read_text())[1]
OLDEST_STACK = STACKS[0]
EXPORTER, LOADER = REPO / ".venv", REPO / f".venv-tf{OLDEST_STACK}"  # set up once they hold the Makefile's stamp
SET_UP = ".hvdk8s-setup"
CLASS_NAMES = [str(i) for i in range(10)]

EXPORT = """
import json, sys
from pathlib import Path
import keras
import tensorflow as tf
from hvdk8s import models, serving
from hvdk8s.serving.clients.loadtest import digits_png

base, out = map(Path, sys.argv[1:])
keras.utils.set_random_seed(0)
path = serving.export(models.cnn("cnn", seed=0), base, class_names=[str(i) for i in range(10)])
images = digits_png(6)
for i, image in enumerate(images):
    (out / f"{i}.png").write_bytes(image)
answer = tf.saved_model.load(str(path)).signatures["serving_default"](image_bytes=tf.constant(images))
(out / "exported.json").write_text(json.dumps({"tensorflow": tf.__version__, "version": str(path),
                                               "probabilities": answer["probabilities"].numpy().tolist()}))
"""

LOAD = """
import json, sys
from pathlib import Path
import tensorflow as tf

version, out = map(Path, sys.argv[1:])
loaded = tf.saved_model.load(str(version), tags=["serve"])
images = [(out / f"{i}.png").read_bytes() for i in range(6)]
answer = loaded.signatures["serving_default"](image_bytes=tf.constant(images))
tensor = loaded.signatures["predict_tensor"](images=tf.zeros((2, 28, 28, 1)))
(out / "loaded.json").write_text(json.dumps({
    "tensorflow": tf.__version__, "signatures": sorted(loaded.signatures),
    "probabilities": answer["probabilities"].numpy().tolist(), "classes": answer["classes"].numpy().tolist(),
    "class_names": [n.decode() for n in answer["class_names"].numpy()],
    "tensor_shape": list(tensor["probabilities"].shape)}))
"""


def run(venv: Path, script: str, *args: Path) -> None:
    python = venv / "bin" / "python"
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.run([str(python), "-c", script, *map(str, args)], cwd=args[-1], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{python} exited {proc.returncode}\n{proc.stderr[-4000:]}"


@pytest.mark.skipif(not (EXPORTER / SET_UP).is_file(),
                    reason=f"needs the default stack's {EXPORTER} set up (make setup) to export")
@pytest.mark.skipif(not (LOADER / SET_UP).is_file(),
                    reason=f"needs the oldest stack's {LOADER} set up (make test-stack TF={OLDEST_STACK}) to load")
def test_the_default_stacks_savedmodel_answers_under_the_oldest_tensorflow(tmp_path: Path) -> None:
    run(EXPORTER, EXPORT, tmp_path / "models", tmp_path)
    exported = json.loads((tmp_path / "exported.json").read_text())
    assert exported["tensorflow"].startswith(DEFAULT_STACK + "."), exported["tensorflow"]
    from tensorflow.core.protobuf import saved_model_pb2

    saved = saved_model_pb2.SavedModel.FromString((Path(exported["version"]) / "saved_model.pb").read_bytes())
    assert saved.meta_graphs[0].meta_info_def.tensorflow_version == exported["tensorflow"]  # as TF Serving sees it

    run(LOADER, LOAD, Path(exported["version"]), tmp_path)
    loaded = json.loads((tmp_path / "loaded.json").read_text())
    assert loaded["tensorflow"].startswith(OLDEST_STACK + "."), loaded["tensorflow"]
    assert loaded["signatures"] == ["predict_tensor", "serving_default"]
    np.testing.assert_allclose(loaded["probabilities"], exported["probabilities"], atol=1e-5)
    classes = np.argmax(loaded["probabilities"], axis=1).tolist()  # the loading side's own: no tie across versions
    assert loaded["classes"] == classes and loaded["class_names"] == [CLASS_NAMES[k] for k in classes]
    assert loaded["tensor_shape"] == [2, 10]
