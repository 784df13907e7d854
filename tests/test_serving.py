"""Export, model selection, the local TF Serving-compatible server and the predict client.

Real artefacts throughout: a CNN trained for a few epochs on the digits,
SavedModels read by ``saved_model_cli`` and by plain TensorFlow in a process
that never imports hvdk8s, real PNG/JPEG bytes, and a real server process
on an ephemeral port answering over HTTP.
"""
from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import requests
import tensorflow as tf
from PIL import Image

import hvdk8s.cli
from hvdk8s import data, models, serving
from hvdk8s.serving.model import savedmodel
from hvdk8s.serving.server.process import running

from serving_models import CLI

DIGIT_NAMES = [str(i) for i in range(10)]
WORD_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
N_IMAGES = 12


def cli(*argv: str) -> int:
    """The CLI in-process, for exit codes and messages."""
    return hvdk8s.cli.main(list(argv))


def train(variant: str, epochs: int, x, y) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = models.cnn(variant, seed=0)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    if epochs:
        model.fit(x, y, epochs=epochs, batch_size=64, verbose=0)
    return model


def encode(pixels: np.ndarray, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def b64(image: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(image).decode()}


@pytest.fixture(scope="module")
def digits():
    return data.load_digits()


@pytest.fixture(scope="module")
def trained(digits):
    (x_train, y_train), _ = digits
    return train("cnn", 2, x_train, y_train)


@pytest.fixture(scope="module")
def images(digits, trained):
    """Test digits as PNG and JPEG bytes, with the Keras model's probabilities on the same pixels.

    PNG is lossless, so its reference input is the uint8 pixels / 255; JPEG is
    lossy, so its reference is the model on the JPEG's decoded pixels.
    """
    _, (x_test, y_test) = digits
    pixels = np.round(x_test[:N_IMAGES, ..., 0] * 255).astype(np.uint8)
    png = [encode(p, "PNG") for p in pixels]
    jpeg = [encode(p, "JPEG") for p in pixels]
    jpeg_pixels = np.stack([tf.io.decode_jpeg(j, channels=1).numpy() for j in jpeg])
    assert not np.array_equal(jpeg_pixels[..., 0], pixels)  # really lossy: a distinct reference
    return {
        "png": png,
        "jpeg": jpeg,
        "png_ref": trained.predict(pixels[..., None].astype("float32") / 255.0, verbose=0),
        "jpeg_ref": trained.predict(jpeg_pixels.astype("float32") / 255.0, verbose=0),
    }


@pytest.fixture(scope="module")
def base_path(tmp_path_factory, trained):
    """models/digits with version 1 exported from the trained model (the server serves it)."""
    base = tmp_path_factory.mktemp("models") / "digits"
    serving.export(trained, base, class_names=DIGIT_NAMES)
    return base


@pytest.fixture(scope="module")
def tiny():
    """An untrained 8x8x1 -> 3 classes model: quick to evaluate and export."""
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(3, activation="softmax")],
                            name="tiny")


# --- export ----------------------------------------------------------------------------------


def test_saved_model_cli_shows_both_signatures(base_path):
    cli = Path(sys.executable).with_name("saved_model_cli")
    out = subprocess.run(
        [str(cli), "show", "--all", "--dir", str(base_path / "1")], capture_output=True, text=True, check=True
    ).stdout
    sections = {s.split("']")[0]: s for s in out.split("signature_def['")[1:]}
    default = sections["serving_default"]
    assert "inputs['image_bytes'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in default
    assert "outputs['probabilities'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, 10)" in default
    assert "outputs['classes'] tensor_info:\n        dtype: DT_INT64\n        shape: (-1)" in default
    assert "outputs['class_names'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)" in default
    assert "Method name is: tensorflow/serving/predict" in default
    tensor = sections["predict_tensor"]
    assert "inputs['images'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, 28, 28, 1)" in tensor
    assert "outputs['probabilities']" in tensor and "outputs['classes']" in tensor


PLAIN_TF = """
import sys, json, numpy as np, tensorflow as tf
loaded = tf.saved_model.load(sys.argv[1])
out = {}
for fmt in ("png", "jpeg"):
    blobs = [open(p, "rb").read() for p in json.loads(sys.argv[2])[fmt]]
    result = loaded.signatures["serving_default"](image_bytes=tf.constant(blobs))
    out[fmt] = {k: v.numpy().tolist() for k, v in result.items()}
    out[fmt]["class_names"] = [n.decode() for n in result["class_names"].numpy()]
images = np.load(sys.argv[3])
out["tensor"] = loaded.signatures["predict_tensor"](images=tf.constant(images))["probabilities"].numpy().tolist()
out["hvdk8s_imported"] = any(name.split(".")[0] == "hvdk8s" for name in sys.modules)
print(json.dumps(out))
"""


def test_plain_tensorflow_serves_png_and_jpeg_like_keras(tmp_path, base_path, images, digits, trained):
    paths = {}
    for fmt in ("png", "jpeg"):
        paths[fmt] = []
        for i, blob in enumerate(images[fmt]):
            (path := tmp_path / f"digit{i}.{fmt}").write_bytes(blob)
            paths[fmt].append(str(path))
    x = digits[1][0][:N_IMAGES]
    np.save(tmp_path / "x.npy", x)
    run = subprocess.run(
        [sys.executable, "-c", PLAIN_TF, str(base_path / "1"), json.dumps(paths), str(tmp_path / "x.npy")],
        capture_output=True, text=True, cwd=tmp_path, check=True,
    )
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["hvdk8s_imported"] is False
    for fmt in ("png", "jpeg"):
        ref = images[f"{fmt}_ref"]
        assert out[fmt]["classes"] == ref.argmax(axis=1).tolist()
        assert out[fmt]["class_names"] == [DIGIT_NAMES[k] for k in ref.argmax(axis=1)]
        np.testing.assert_allclose(out[fmt]["probabilities"], ref, atol=1e-5)
    np.testing.assert_allclose(out["tensor"], trained.predict(x, verbose=0), atol=1e-5)


def test_export_is_atomic_and_numbers_versions(tmp_path, trained):
    base = tmp_path / "digits"
    (base / "3").mkdir(parents=True)
    (base / "notes").mkdir()
    seen: set[str] = set()
    incomplete: list[str] = []
    done = threading.Event()

    def watch() -> None:  # what a polling server would see while the export runs
        while not done.is_set():
            for entry in os.scandir(base):
                seen.add(entry.name)
                if entry.name == "4" and not (base / "4" / savedmodel.METADATA_FILE).exists():
                    incomplete.append(entry.name)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        path = serving.export(trained, base)
    finally:
        done.set()
        watcher.join()
    assert path == base / "4" and serving.versions(base) == [3, 4] and serving.next_version(base) == 5
    assert any(name.startswith(".tmp-4-") for name in seen), seen  # written elsewhere first...
    assert incomplete == []  # ...and never visible half-written under its number
    assert {"saved_model.pb", "fingerprint.pb", "variables", "assets.extra"} <= {p.name for p in path.iterdir()}
    record = serving.read_metadata(path)
    assert record["version"] == 4 and record["input_shape"] == [28, 28, 1] and record["preprocessing"] == "unit"
    assert sorted(p.name for p in base.iterdir()) == ["3", "4", "notes"]

    with pytest.raises(FileExistsError, match="version 4 already exists"):
        serving.export(trained, base, version=4)

    def broken(pixels):
        raise RuntimeError("preprocessing failed while tracing")

    with pytest.raises(RuntimeError, match="preprocessing failed"):
        serving.export(trained, base, preprocessing=broken)
    with pytest.raises(ValueError, match="class_names: 3 names for a model with 10 outputs"):
        serving.export(trained, base, class_names=["a", "b", "c"])
    assert sorted(p.name for p in base.iterdir()) == ["3", "4", "notes"]  # failures leave nothing behind


def test_export_cli(tmp_path, trained, capsys):
    trained.save(model_file := tmp_path / "model.keras")
    base = tmp_path / "models" / "digits"
    assert cli("export", str(model_file), "--base-path", str(base), "--version", "7",
                    "--class-names", ",".join(WORD_NAMES)) == 0
    assert f"as {base / '7'}" in capsys.readouterr().out
    assert serving.read_metadata(base / "7")["class_names"] == WORD_NAMES
    assert cli("export", str(model_file), "--base-path", str(base), "--version", "7") == 2
    assert "hvdk8s export: error: version 7 already exists" in capsys.readouterr().err
    assert cli("export", str(model_file), "--base-path", str(base)) == 0
    assert capsys.readouterr().err == ("hvdk8s export: without --class-names the answers give class numbers only; "
                                       "name the 10 classes in output order with --class-names NAME,NAME,...\n")
    assert cli("export", str(tmp_path / "missing.keras"), "--base-path", str(base)) == 2
    assert "missing.keras: no such file" in capsys.readouterr().err


def test_export_cli_says_what_is_wrong_with_a_bad_checkpoint(tmp_path, trained, capsys):
    """Issue #28: Keras calls a truncated .keras file "File not found" (in a raw traceback)."""
    trained.save(model_file := tmp_path / "model.keras")
    (truncated := tmp_path / "truncated.keras").write_bytes(model_file.read_bytes()[:1000])
    (notes := tmp_path / "notes.txt").write_text("not a model")
    base = str(tmp_path / "models" / "digits")
    assert cli("export", str(truncated), "--base-path", base) == 2
    err = capsys.readouterr().err
    assert f"hvdk8s export: error: model {truncated}: not a valid .keras file: a .keras file is a zip archive and " \
           "this one (1000 bytes) is not a complete one" in err and "File not found" not in err
    assert cli("export", str(notes), "--base-path", base) == 2
    assert "this one's name ends in '.txt'" in capsys.readouterr().err
    assert cli("export", str(tmp_path), "--base-path", base) == 2
    assert f"model {tmp_path}: is a directory; expected a .keras file" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()


@pytest.mark.parametrize("kwargs, error, message", [
    ({"metadata": {"metrics": {"accuracy": 0.5}, "seen": {1, 2}}}, TypeError,
     "metadata['seen']: cannot be stored as JSON (Object of type set is not JSON serializable)"),
    ({"class_names": "abc"}, TypeError,
     "class_names: expected a sequence of names, got the string 'abc' (for one name per character pass list(...))"),
    ({"class_names": ["a", 1, "c"]}, TypeError, "class_names[1]: expected a str, got int 1"),
], ids=["metadata-not-json", "class-names-string", "class-name-not-string"])
def test_export_refuses_bad_class_names_and_metadata_before_writing(tmp_path, tiny, kwargs, error, message):
    """Unrefused, a string was split into characters, int names were stored as ints, and unstorable metadata
    failed only after the SavedModel was built, leaving the base path behind."""
    with pytest.raises(error) as raised:
        serving.export(tiny, tmp_path / "tiny", **kwargs)
    assert str(raised.value) == message
    assert not (tmp_path / "tiny").exists()


def test_export_stores_numpy_scalars_in_metadata_as_numbers(tmp_path, tiny):
    path = serving.export(tiny, tmp_path / "tiny", metadata={"metrics": {"accuracy": np.float32(0.5)},
                                                             "epochs": np.int64(3)})
    record = serving.read_metadata(path)
    assert (record["metrics"], record["epochs"]) == ({"accuracy": 0.5}, 3)


@pytest.mark.parametrize("command", [["export", "model.keras", "--base-path", "models"], ["predict", "digit.png"],
                                     ["loadtest"]], ids=["export", "predict", "loadtest"])
@pytest.mark.parametrize("version, why", [
    ("-1", "must be 0 or more"),
    ("9223372036854775808", "a model version (TF Serving's are int64) is at most 9223372036854775807"),
    ("9" * 400, "a model version (TF Serving's are int64) is at most 9223372036854775807"),  # beyond a float too
], ids=["negative", "beyond-int64", "beyond-float"])
def test_version_flags_refuse_versions_tf_serving_cannot_have(tmp_path, monkeypatch, capsys, command, version, why):
    """Refused at the flag: export would write a folder that serve ignores; predict and loadtest would ask for one."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        cli(*command, "--version", version)
    assert exited.value.code == 2
    assert capsys.readouterr().err.endswith(f"hvdk8s {command[0]}: error: argument --version: {version}: {why}\n")
    assert not (tmp_path / "models").exists()


# --- model selection -------------------------------------------------------------------------


def test_select_promotes_the_best_candidate_and_records_metrics(tmp_path, digits, trained, capsys):
    (x_train, y_train), (x_test, y_test) = digits
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    trained.save(candidates / "cnn.keras")
    train("cnn_bn", 1, x_train[:400], y_train[:400]).save(candidates / "cnn_bn.keras")
    train("cnn_dropout", 0, x_train, y_train).save(candidates / "cnn_dropout.keras")  # untrained: bad
    accuracy = {}
    for path in candidates.iterdir():
        predicted = keras.models.load_model(path, compile=False).predict(x_test, verbose=0).argmax(axis=1)
        accuracy[path.name] = float(np.mean(predicted == y_test))
    best = max(accuracy, key=accuracy.get)
    assert accuracy["cnn_dropout.keras"] < 0.3 < accuracy[best]

    base = tmp_path / "models" / "digits"
    assert cli("select", str(candidates), "--base-path", str(base), "--class-names",
                    ",".join(DIGIT_NAMES)) == 0
    table = capsys.readouterr().out
    assert f"{best}" in table and f"<- promoted to {base / '1'}" in table
    assert [line.split()[0] for line in table.splitlines()[1:4]] == sorted(accuracy, key=lambda n: -accuracy[n])
    assert "evaluated on digits test split (360 images), ranked by accuracy" in table

    record = serving.read_metadata(base / "1")
    assert record["selection"]["source"] == str(candidates / best)
    assert record["metrics"]["accuracy"] == pytest.approx(accuracy[best], abs=1e-6)
    recorded = {c["name"]: c["accuracy"] for c in record["selection"]["candidates"]}
    assert recorded == pytest.approx(accuracy, abs=1e-6)
    # the promoted SavedModel is the best candidate's weights
    promoted = tf.saved_model.load(str(base / "1")).signatures["predict_tensor"]
    np.testing.assert_allclose(
        promoted(images=tf.constant(x_test[:32]))["probabilities"].numpy(),
        keras.models.load_model(candidates / best).predict(x_test[:32], verbose=0),
        atol=1e-5,
    )
    assert cli("select", str(tmp_path / "none"), "--base-path", str(base)) == 2
    assert "no such directory" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["text", "objects", "single array"])
def test_select_refuses_data_that_is_not_npz_arrays_naming_the_file(tmp_path, capsys, content):
    data = tmp_path / "data.npz"
    if content == "text":
        data.write_text("x,y\n1,2\n")
    elif content == "objects":  # arrays of Python objects need pickle, which loading refuses
        np.savez(data, x=np.array([{"a": 1}], dtype=object), y=np.array([1]))
    else:
        np.save(data, np.zeros(3))  # an .npy under an .npz name: one array, no x and y
        data = tmp_path / "data.npz.npy"
    code = cli("select", str(tmp_path), "--base-path", str(tmp_path / "base"), "--data", str(data))
    err = capsys.readouterr().err
    assert code == 2 and f"--data {data}: not an .npz of numeric arrays x and y" in err and "Traceback" not in err


@pytest.mark.parametrize("labels, classes, wrong", [
    ([3, 12], 10, "label 12 is outside the model's 10 classes (0 to 9)"),
    ([-1, 3], 10, "label -1 is outside the model's 10 classes (0 to 9)"),
    ([1.5, 3.0], 10, "label 1.5 is not a class number (a whole number)"),
    ([[0, 1], [1, 0]], 2, "labels of shape (2, 2): expected one class number per image (not one-hot rows)"),
    (None, 5, "label {first} is outside the model's 5 classes (0 to 4)"),  # the default data: the digits' 10
], ids=["above", "negative", "fraction", "one-hot", "default-data"])
def test_select_refuses_labels_that_are_not_the_models_classes_naming_the_data(tmp_path, capsys, digits, labels,
                                                                                classes, wrong):
    candidates = tmp_path / "candidates"
    candidates.mkdir()
    keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Flatten(),
                      keras.layers.Dense(classes, activation="softmax")]).save(candidates / "tiny.keras")
    base = tmp_path / "base"
    if labels is None:
        _, (_, y_test) = digits
        source, argv = "digits test split (360 images)", []
        wrong = wrong.format(first=y_test[y_test >= classes][0])
    else:
        data = tmp_path / "data.npz"
        np.savez(data, x=np.zeros((2, 28, 28, 1), "float32"), y=np.array(labels))
        source, argv = f"{data} (2 images)", ["--data", str(data)]
    code = cli("select", str(candidates), "--base-path", str(base), *argv)
    err = capsys.readouterr().err
    assert (code, err) == (2, f"hvdk8s select: error: {source}, candidate tiny.keras: {wrong}\n")
    assert not base.exists()


@pytest.mark.parametrize("x, y, batch_size, error, message", [
    (np.zeros((2, 28, 28, 1)), [0, 1], 256, ValueError,
     "images of shape (2, 28, 28, 1) do not fit model 'tiny', whose input shape is (None, 8, 8, 1)"),
    (np.zeros((2, 8, 8, 3)), [0, 1], 256, ValueError,
     "images of shape (2, 8, 8, 3) do not fit model 'tiny', whose input shape is (None, 8, 8, 1)"),
    (np.zeros((2, 64)), [0, 1], 256, ValueError,
     "images of shape (2, 64) do not fit model 'tiny', whose input shape is (None, 8, 8, 1)"),
    (np.full((2, 8, 8, 1), "0"), [0, 1], 256, ValueError, "images of type <U1: expected numbers"),
    (np.zeros((0, 8, 8, 1)), [], 256, ValueError,
     "images of shape (0, 8, 8, 1) and labels of shape (0,): need one label per image, at least one"),
    (np.zeros((3, 8, 8, 1)), [0, 1], 256, ValueError,
     "images of shape (3, 8, 8, 1) and labels of shape (2,): need one label per image, at least one"),
    (np.zeros((2, 8, 8, 1)), [0, 1], 0, ValueError, "batch_size=0: must be >= 1"),
    (np.zeros((2, 8, 8, 1)), [0, 1], 2.0, TypeError, "batch_size: expected a whole number, got float 2.0"),
], ids=["28x28", "3-channels", "flat", "strings", "empty", "more-images", "batch-0", "batch-float"])
def test_evaluate_refuses_bad_input_before_the_model_runs(tiny, x, y, batch_size, error, message):
    """Unrefused: a Keras error about a Dense layer, numpy's "need at least one array to concatenate", range()'s
    "arg 3 must not be zero"."""
    with pytest.raises(error) as raised:
        serving.evaluate(tiny, x, np.array(y), batch_size)
    assert str(raised.value) == message


def test_evaluate_takes_the_shapes_keras_takes(tiny):
    """``None`` sizes match any size; a missing or surplus last axis of size 1 is Keras's to add or drop."""
    labels = np.array([0, 1, 2])
    expected = serving.evaluate(tiny, np.ones((3, 8, 8, 1)), labels, batch_size=2)
    assert serving.evaluate(tiny, np.ones((3, 8, 8)), labels) == pytest.approx(expected)
    assert serving.evaluate(tiny, np.ones((3, 8, 8, 1, 1)), labels) == pytest.approx(expected)
    assert serving.evaluate(tiny, np.ones((3, 8, 8, 1)), labels[:, None]) == pytest.approx(expected)  # a column
    pooled = keras.Sequential([keras.Input((None, None, 1)), keras.layers.GlobalAveragePooling2D(),
                               keras.layers.Dense(3, activation="softmax")])
    assert serving.evaluate(pooled, np.ones((3, 5, 7, 1)), labels).keys() == {"accuracy", "loss"}


@pytest.mark.parametrize("data, message", [
    ((np.zeros((2, 8, 8, 1)),), "data: must be a pair (x, y) of images and labels, got tuple of length 1"),
    (np.zeros((2, 8, 8, 1)), "data: must be a pair (x, y) of images and labels, got ndarray"),
    ((np.zeros((0, 8, 8, 1)), np.zeros(0)),
     "given arrays: images of shape (0, 8, 8, 1) and labels of shape (0,): need one label per image, at least one"),
    ((np.zeros((2, 28, 28, 1)), np.zeros(2)), "given arrays (2 images), candidate tiny.keras: images of shape "
                                              "(2, 28, 28, 1) do not fit model 'tiny', whose input shape is "
                                              "(None, 8, 8, 1)"),
], ids=["one-array", "not-a-pair", "empty", "28x28"])
def test_select_refuses_data_that_the_candidates_cannot_take(tmp_path, tiny, data, message):
    tiny.save(tmp_path / "tiny.keras")
    with pytest.raises(ValueError) as raised:
        serving.select(tmp_path, tmp_path / "base", data=data)
    assert str(raised.value) == message
    assert not (tmp_path / "base").exists()


# --- local serving and the client ------------------------------------------------------------


@pytest.fixture(scope="module")
def server(base_path, tmp_path_factory):
    """``hvdk8s serve`` on ephemeral ports, keeping the two newest versions loaded."""
    log = tmp_path_factory.mktemp("server") / "stderr.log"
    with running(base_path, log, "--max-request-bytes", "100000", "--poll-seconds", "0.3",
                 "--num-versions", "2") as srv:
        yield srv.url


def predict(url: str, doc, path: str = "/v1/models/digits:predict", **kwargs) -> requests.Response:
    return requests.post(url + path, json=doc, timeout=60, **kwargs)


def test_status_and_metadata(server):
    status = requests.get(f"{server}/v1/models/digits", timeout=10)
    assert status.status_code == 200
    rows = {r["version"]: r for r in status.json()["model_version_status"]}
    assert rows["1"] == {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}

    meta = requests.get(f"{server}/v1/models/digits/versions/1/metadata", timeout=10).json()
    assert meta["model_spec"] == {"name": "digits", "signature_name": "", "version": "1"}
    sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert sig["inputs"]["image_bytes"]["dtype"] == "DT_STRING"
    shape = sig["inputs"]["image_bytes"]["tensor_shape"]
    assert shape == {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    assert {k: v["dtype"] for k, v in sig["outputs"].items()} == {
        "probabilities": "DT_FLOAT", "classes": "DT_INT64", "class_names": "DT_STRING"
    }
    tensor = meta["metadata"]["signature_def"]["signature_def"]["predict_tensor"]
    assert [d["size"] for d in tensor["inputs"]["images"]["tensor_shape"]["dim"]] == ["-1", "28", "28", "1"]


@pytest.mark.parametrize("fmt", ["png", "jpeg"])
def test_predict_instances_match_keras(server, images, fmt):
    response = predict(server, {"instances": [b64(i) for i in images[fmt]]})
    assert response.status_code == 200, response.text
    predictions = response.json()["predictions"]
    ref = images[f"{fmt}_ref"]
    assert [p["classes"] for p in predictions] == ref.argmax(axis=1).tolist()
    np.testing.assert_allclose([p["probabilities"] for p in predictions], ref, atol=1e-5)


def test_predict_columnar_inputs_and_tensor_signature(server, images, digits, trained):
    columnar = {"signature_name": "serving_default", "inputs": {"image_bytes": [b64(i) for i in images["png"]]}}
    response = predict(server, columnar)
    assert response.status_code == 200, response.text
    outputs = response.json()["outputs"]
    assert outputs["classes"] == images["png_ref"].argmax(axis=1).tolist()
    np.testing.assert_allclose(outputs["probabilities"], images["png_ref"], atol=1e-5)

    x = digits[1][0][:3]
    response = predict(server, {"signature_name": "predict_tensor", "instances": x.tolist()},
                       path="/v1/models/digits/versions/1:predict")
    assert response.status_code == 200, response.text
    np.testing.assert_allclose([p["probabilities"] for p in response.json()["predictions"]],
                               trained.predict(x, verbose=0), atol=1e-5)


BAD_REQUESTS = [
    pytest.param({"instances": [{"b64": "%%% not base64 %%%"}]}, 400, "Unable to base64 decode", id="invalid-base64"),
    pytest.param({"instances": [b64(b"not an image")]}, 400, "Unknown image file format", id="not-an-image"),
    pytest.param({"instances": []}, 400, "No values in 'instances' array", id="empty-instances"),
    pytest.param({"instances": [{"image": b64(b"x")}]}, 400, "keys must be equal to: image_bytes", id="wrong-name"),
    pytest.param({"inputs": {"image": [b64(b"x")]}}, 400, "Missing named input: image_bytes", id="wrong-name-inputs"),
    pytest.param({"signature_name": "serve", "instances": [b64(b"x")]}, 400, 'signature name: "serve" not found',
                 id="unknown-signature"),
    pytest.param({"instances": [b64(b"\0" * 80_000)]}, 413, "exceeds the limit of 100000 bytes", id="oversized"),
]


@pytest.mark.parametrize("doc, status, message", BAD_REQUESTS)
def test_bad_requests_get_clear_errors_and_the_server_keeps_serving(server, images, doc, status, message):
    response = predict(server, doc)
    assert response.status_code == status and message in response.json()["error"], response.text
    good = predict(server, {"instances": [b64(images["png"][0])]})
    assert good.status_code == 200 and good.json()["predictions"][0]["classes"] == images["png_ref"][0].argmax()


def test_unknown_model_version_and_body(server):
    cases = [
        (requests.get(f"{server}/v1/models/mnist", timeout=10), 404, "Could not find any versions of model mnist"),
        (predict(server, {}, path="/v1/models/mnist:predict"), 404, "Servable not found for request: Latest(mnist"),
        (predict(server, {}, path="/v1/models/digits/versions/99:predict"), 404, "Specific(digits, 99)"),
        (requests.post(f"{server}/v1/models/digits:predict", data=b"{oops", timeout=10), 400, "JSON Parse error"),
    ]
    for response, status, message in cases:
        assert response.status_code == status and message in response.json()["error"], response.text


def test_new_version_is_served_without_restart(server, base_path, trained, images):
    serving.export(trained, base_path, version=2, class_names=WORD_NAMES)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = requests.get(f"{server}/v1/models/digits", timeout=10).json()["model_version_status"]
        if {r["version"]: r["state"] for r in rows}.get("2") == "AVAILABLE":
            break
        time.sleep(0.3)
    assert {r["version"]: r["state"] for r in rows} == {"2": "AVAILABLE", "1": "AVAILABLE"}
    expected = int(images["png_ref"][0].argmax())
    doc = {"instances": [b64(images["png"][0])]}
    for path, names in [
        ("/v1/models/digits:predict", WORD_NAMES),  # the newest version by default
        ("/v1/models/digits/versions/2:predict", WORD_NAMES),
        ("/v1/models/digits/versions/1:predict", DIGIT_NAMES),
    ]:
        assert predict(server, doc, path=path).json()["predictions"][0]["class_names"] == names[expected]


def test_predict_cli_against_the_server(server, images, tmp_path):
    files = []
    for fmt in ("png", "jpeg"):
        for i in range(3):
            (path := tmp_path / f"d{i}.{fmt}").write_bytes(images[fmt][i])
            files.append((path, int(images[f"{fmt}_ref"][i].argmax())))
    run = subprocess.run([*CLI, "predict", "--url", server, "--model", "digits", *(str(p) for p, _ in files)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.strip().splitlines()
    assert [line.split(": class ")[0] for line in lines] == [str(p) for p, _ in files]
    assert [int(line.split(": class ")[1].split()[0]) for line in lines] == [k for _, k in files]
    assert all(len(line.split("[")[1].split()) == 10 for line in lines)  # all ten probabilities

    bad = subprocess.run([*CLI, "predict", "--url", server, "--model", "mnist", str(files[0][0])],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "HTTP 404: Servable not found for request: Latest(mnist)" in bad.stderr


def test_predict_cli_on_a_directory_says_it_wants_image_files(tmp_path, capsys):
    """Issue #28: a folder was reported as "no such file"."""
    assert cli("predict", "--url", "http://127.0.0.1:1", str(tmp_path)) == 2
    assert f"hvdk8s predict: error: images: {tmp_path}: a directory; expected image files (JPEG or PNG), " \
           f"e.g. {tmp_path / '*.png'}" in capsys.readouterr().err


@pytest.mark.parametrize("version, error, message", [
    (-1, ValueError, "version=-1: must be >= 0"),
    (2**63, ValueError, f"version={2**63}: must be <= {2**63 - 1} (TF Serving's versions are int64)"),
    ("3", TypeError, "version: expected a whole number, got str '3'"),
])
def test_rejected_export_leaves_no_base_path_behind(tmp_path, trained, version, error, message):
    with pytest.raises(error) as refused:
        serving.export(trained, tmp_path / "new", version=version)
    assert str(refused.value) == message
    assert not (tmp_path / "new").exists()


def test_export_takes_a_numpy_version(tmp_path, trained):
    assert serving.export(trained, tmp_path / "m", version=np.int64(4)) == tmp_path / "m" / "4"
