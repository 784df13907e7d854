"""``hvdk8s migrate``: every rule as input -> output (comments kept), what it reports, and the CLI contract."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hvdk8s.migrate import LOSS_ALIASES, Finding, cli as migrate_cli, migrate_source

from conftest import HVDK8S, REPO

RULES = [
    ("horovod tf keras import",
     "import horovod.tensorflow.keras as hvd  # Horovod\n",
     "import hvdk8s as hvd  # Horovod\n"),
    ("horovod keras import",
     "import horovod.keras as hvd\n",
     "import hvdk8s as hvd\n"),
    ("from horovod import",
     "from horovod.tensorflow.keras import callbacks, elastic\n",
     "from hvdk8s import callbacks, elastic\n"),
    ("from horovod submodule",
     "from horovod.tensorflow.keras.callbacks import MetricAverageCallback\n"
     "from horovod.keras.elastic import KerasState\n",
     "from hvdk8s.callbacks import MetricAverageCallback\n"
     "from hvdk8s.elastic import KerasState\n"),
    ("unaliased horovod import and its uses",
     "import horovod.tensorflow.keras\nhorovod.tensorflow.keras.init()\nhorovod.tensorflow.keras.callbacks.MetricAverageCallback()\n",
     "import hvdk8s\nhvdk8s.init()\nhvdk8s.callbacks.MetricAverageCallback()\n"),
    ("experimental_run_tf_function dropped, last argument",
     "model.compile(loss='mse',\n              optimizer=opt,  # wrapped\n              experimental_run_tf_function=False)\n",
     "model.compile(loss='mse',\n              optimizer=opt  # wrapped\n              )\n"),
    ("experimental_run_tf_function dropped, middle argument",
     "model.compile(experimental_run_tf_function=False, loss='mse')\n",
     "model.compile(loss='mse')\n"),
    ("optimizer lr=",
     "opt = keras.optimizers.SGD(lr=0.1, momentum=0.9)  # base\nopt2 = tf.keras.optimizers.Adam(lr=1e-3)\n",
     "opt = keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)  # base\n"
     "opt2 = tf.keras.optimizers.Adam(learning_rate=1e-3)\n"),
    ("lr= of optimizers imported from Keras",
     "from keras.optimizers import Adam\nfrom tensorflow.keras.optimizers import SGD as KerasSGD\n"
     "from tensorflow import keras\nimport tensorflow.keras.optimizers as ko\n"
     "a = Adam(lr=1e-3)\nb = KerasSGD(lr=0.1)\nc = keras.optimizers.RMSprop(lr=0.1)\nd = ko.Nadam(lr=0.1)\n",
     "from keras.optimizers import Adam\nfrom tensorflow.keras.optimizers import SGD as KerasSGD\n"
     "from tensorflow import keras\nimport tensorflow.keras.optimizers as ko\n"
     "a = Adam(learning_rate=1e-3)\nb = KerasSGD(learning_rate=0.1)\nc = keras.optimizers.RMSprop(learning_rate=0.1)\n"
     "d = ko.Nadam(learning_rate=0.1)\n"),
    ("lr= of other calls untouched",
     "sched = make_schedule(lr=0.1)\n",
     "sched = make_schedule(lr=0.1)\n"),
    ("lr= of PyTorch's optimizers (and of an Adam from nowhere known) untouched",
     "import torch\nfrom torch.optim import SGD\nopt = torch.optim.Adam([w], lr=0.1)\nopt2 = SGD([w], lr=0.1)\n"
     "opt3 = Adam(lr=0.1)\n",
     "import torch\nfrom torch.optim import SGD\nopt = torch.optim.Adam([w], lr=0.1)\nopt2 = SGD([w], lr=0.1)\n"
     "opt3 = Adam(lr=0.1)\n"),
    (".lr of optimizers",
     "print(model.optimizer.lr)\nopt = keras.optimizers.Adam(0.1)\nx = opt.lr\nself.model.optimizer.lr.assign(2)\n",
     "print(model.optimizer.learning_rate)\nopt = keras.optimizers.Adam(0.1)\nx = opt.learning_rate\n"
     "self.model.optimizer.learning_rate.assign(2)\n"),
    (".lr of anything else untouched",
     "scaled_lr = args.lr * hvd.size()\n",
     "scaled_lr = args.lr * hvd.size()\n"),
    ("set_value through each backend spelling",
     "from keras import backend as K\nK.set_value(model.optimizer.lr, 0.5)  # reset\n"
     "tf.keras.backend.set_value(state.model.optimizer.lr,  0.001 * hvd.size())\n"
     "keras.backend.set_value(v, 3)\n",
     "from keras import backend as K\nmodel.optimizer.learning_rate.assign(0.5)  # reset\n"
     "state.model.optimizer.learning_rate.assign(0.001 * hvd.size())\nv.assign(3)\n"),
    ("get_value adds import keras",
     "import tensorflow as tf\nlr = tf.keras.backend.get_value(opt.lr)\n",
     "import tensorflow as tf\nimport keras\n\nlr = keras.ops.convert_to_numpy(opt.learning_rate)\n"),
    ("fit_generator positional arguments become keywords, queue arguments go",
     "model.fit_generator(gen, 100, 5,  # five epochs\n                    workers=1, max_queue_size=10, use_multiprocessing=False)\n",
     "model.fit(gen, steps_per_epoch=100, epochs=5  # five epochs\n                    )\n"),
    ("evaluate_generator and predict_generator stay quiet",
     "score = model.evaluate_generator(gen, 10)\np = model.predict_generator(gen, steps=3, verbose=1)\n",
     "score = model.evaluate(gen, steps=10, verbose=0)\np = model.predict(gen, steps=3, verbose=1)\n"),
    ("queue arguments of fit",
     "model.fit(x, y, epochs=2, max_queue_size=4)\n",
     "model.fit(x, y, epochs=2)\n"),
    ("legacy and experimental optimizers",
     "opt = tf.keras.optimizers.legacy.Adam(0.1)\nopt = keras.optimizers.experimental.AdamW(0.1)\n"
     "from keras.optimizers.legacy import SGD\n",
     "opt = tf.keras.optimizers.Adam(0.1)\nopt = keras.optimizers.AdamW(0.1)\nfrom keras.optimizers import SGD\n"),
    ("mixed precision experimental API",
     "policy = tf.keras.mixed_precision.experimental.Policy('mixed_float16')\n"
     "tf.keras.mixed_precision.experimental.set_policy(policy)\n",
     "policy = tf.keras.mixed_precision.Policy('mixed_float16')\n"
     "tf.keras.mixed_precision.set_global_policy(policy)\n"),
    ("TF1 session config to tf.config",
     "# pin one GPU\nconfig = tf.ConfigProto()\nconfig.gpu_options.allow_growth = True\n"
     "config.gpu_options.visible_device_list = str(hvd.local_rank())\n"
     "# apply it\nK.set_session(tf.Session(config=config))\nmodel = build()\n",
     "# pin one GPU\ngpus = tf.config.list_physical_devices(\"GPU\")\n"
     "for gpu in gpus:\n    tf.config.experimental.set_memory_growth(gpu, True)\n"
     "if gpus:\n    tf.config.set_visible_devices(gpus[hvd.local_rank()], \"GPU\")\n"
     "# apply it\nmodel = build()\n"),
    ("TF1 compat config with threads, in a function",
     "def setup(n):\n    cfg = tf.compat.v1.ConfigProto()\n    cfg.intra_op_parallelism_threads = n\n"
     "    cfg.gpu_options.visible_device_list = devices\n"
     "    tf.compat.v1.keras.backend.set_session(tf.compat.v1.Session(config=cfg))\n",
     "def setup(n):\n    gpus = tf.config.list_physical_devices(\"GPU\")\n"
     "    tf.config.threading.set_intra_op_parallelism_threads(n)\n"
     "    if gpus:\n        tf.config.set_visible_devices([gpus[int(i)] for i in devices.split(\",\")], \"GPU\")\n"),
    ("TF1 config arguments, one statement each",
     "config = tf.ConfigProto(allow_soft_placement=True, device_count={'GPU': 0})  # CPU only\n"
     "K.set_session(tf.Session(config=config))\n",
     "tf.config.set_soft_device_placement(True)  # CPU only\ntf.config.set_visible_devices([], \"GPU\")\n"),
    ("TF1 config built inline",
     "# no GPU here\nkeras.backend.set_session(tf.Session(config=tf.ConfigProto(device_count={'GPU': 0})))\n",
     "# no GPU here\ntf.config.set_visible_devices([], \"GPU\")\n"),
    ("ModelCheckpoint .h5 paths",
     "cb = keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.h5')\n"
     "cb = ModelCheckpoint(filepath=\"w-{epoch}.hdf5\", save_weights_only=True)\n",
     "cb = keras.callbacks.ModelCheckpoint('./checkpoint-{epoch}.keras')\n"
     "cb = ModelCheckpoint(filepath=\"w-{epoch}.weights.h5\", save_weights_only=True)\n"),
    ("save_weights .h5",
     "model.save_weights('weights.h5')\n",
     "model.save_weights('weights.weights.h5')\n"),
    # Keras 3 writes a .h5 model as legacy HDF5, which it cannot resume training from: a path that reaches a save
    # becomes .keras (.weights.h5 for weights) wherever it is written, and reads of the same file follow it
    ("argparse default of a checkpoint format, as in Horovod's ImageNet example",
     "parser.add_argument('--checkpoint-format', default='./checkpoint-{epoch}.h5',\n"
     "                    help='checkpoint file format')\nargs = parser.parse_args()\n"
     "if os.path.exists(args.checkpoint_format.format(epoch=3)):\n"
     "    model = hvd.load_model(args.checkpoint_format.format(epoch=3))\n"
     "callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint_format))\n",
     "parser.add_argument('--checkpoint-format', default='./checkpoint-{epoch}.keras',\n"
     "                    help='checkpoint file format')\nargs = parser.parse_args()\n"
     "if os.path.exists(args.checkpoint_format.format(epoch=3)):\n"
     "    model = hvd.load_model(args.checkpoint_format.format(epoch=3))\n"
     "callbacks.append(keras.callbacks.ModelCheckpoint(args.checkpoint_format))\n"),
    ("argparse dest= and absl flags",
     "p.add_argument('-c', dest='ckpt', default='w-{epoch}.hdf5')\ncb = ModelCheckpoint(a.ckpt, save_weights_only=True)\n"
     "flags.DEFINE_string('model_path', 'model.h5', 'where to save')\nmodel.save(FLAGS.model_path)\n",
     "p.add_argument('-c', dest='ckpt', default='w-{epoch}.weights.h5')\n"
     "cb = ModelCheckpoint(a.ckpt, save_weights_only=True)\n"
     "flags.DEFINE_string('model_path', 'model.keras', 'where to save')\nmodel.save(FLAGS.model_path)\n"),
    ("module constant saved and loaded",
     "CHECKPOINT = 'best.h5'  # best epoch\ncb = ModelCheckpoint(CHECKPOINT, save_best_only=True)\n"
     "model = keras.models.load_model(CHECKPOINT)\n",
     "CHECKPOINT = 'best.keras'  # best epoch\ncb = ModelCheckpoint(CHECKPOINT, save_best_only=True)\n"
     "model = keras.models.load_model(CHECKPOINT)\n"),
    ("f-strings, os.path.join, + and %, positional save_weights_only",
     "cb = ModelCheckpoint(f'{args.dir}/ckpt-{{epoch}}.hdf5')\n"
     "w = ModelCheckpoint(os.path.join(log_dir, 'w-{epoch:02d}.h5'), 'val_loss', 0, True, True)\n"
     "model.save(out_dir + '/final.h5')\nmodel.save_weights('%s/w.h5' % out_dir)\n",
     "cb = ModelCheckpoint(f'{args.dir}/ckpt-{{epoch}}.keras')\n"
     "w = ModelCheckpoint(os.path.join(log_dir, 'w-{epoch:02d}.weights.h5'), 'val_loss', 0, True, True)\n"
     "model.save(out_dir + '/final.keras')\nmodel.save_weights('%s/w.weights.h5' % out_dir)\n"),
    ("reads of a file the script saves follow its new name",
     "model.save('model.h5')\nm = load_model('model.h5')\ncb = ModelCheckpoint('ck-{epoch:02d}.h5')\n"
     "if os.path.exists('ck-03.h5'):\n    m = hvd.load_model('ck-03.h5')\n"
     "keras.models.save_model(model, filepath=\"m.hdf5\")\nmodel.load_weights(\"m.hdf5\")\n",
     "model.save('model.keras')\nm = load_model('model.keras')\ncb = ModelCheckpoint('ck-{epoch:02d}.keras')\n"
     "if os.path.exists('ck-03.keras'):\n    m = hvd.load_model('ck-03.keras')\n"
     "keras.models.save_model(model, filepath=\"m.keras\")\nmodel.load_weights(\"m.keras\")\n"),
    ("a module's save saves no model, but a file the model is saved to follows",
     "import wandb\nmodel.save('m.h5')\nwandb.save('m.h5')\n",
     "import wandb\nmodel.save('m.keras')\nwandb.save('m.keras')\n"),
    ("a function parameter's default",
     "def train(model, path='final.h5'):\n    model.save(path)\n",
     "def train(model, path='final.keras'):\n    model.save(path)\n"),
    ("loss and metric short names",
     "model.compile(loss=keras.losses.mse, metrics=[keras.metrics.mae, tf.keras.losses.logcosh])\n",
     "model.compile(loss=keras.losses.mean_squared_error, metrics=[keras.metrics.mean_absolute_error, "
     "tf.keras.losses.log_cosh])\n"),
    ("Keras 2 layer and utils submodules",
     "from keras.layers.core import Dense, Dropout\nfrom keras.layers.merge import concatenate\n"
     "x = keras.layers.convolutional.Conv2D(8, 3)\nfrom keras.utils.np_utils import to_categorical\n",
     "from keras.layers import Dense, Dropout\nfrom keras.layers import concatenate\n"
     "x = keras.layers.Conv2D(8, 3)\nfrom keras.utils import to_categorical\n"),
    ("ImageDataGenerator import from tf.keras's legacy copy",
     "from keras.preprocessing.image import ImageDataGenerator\nfrom keras.preprocessing import image\n",
     "from tensorflow.keras.preprocessing.image import ImageDataGenerator\nfrom tensorflow.keras.preprocessing import image\n"),
]  # fmt: skip


@pytest.mark.parametrize("before,after", [r[1:] for r in RULES], ids=[r[0] for r in RULES])
def test_rule(before: str, after: str) -> None:
    assert migrate_source(before).code == after


def test_keras3_code_is_left_alone() -> None:
    script = (REPO / "examples" / "train_digits.py").read_text()
    assert migrate_source(script) == migrate_source(script)  # deterministic
    assert migrate_source(script).code == script
    assert not migrate_source(script).findings


FINDINGS = [
    ("opt = keras.optimizers.SGD(0.1, decay=1e-6)\n", 1, "InverseTimeDecay", True),
    ("x = 1\nsess = tf.Session()\n", 2, "tf.Session: TF 1 sessions", True),
    ("from keras.engine.topology import Layer\n", 1, "keras.engine: private Keras 2 module", True),
    ("from keras.layers import CuDNNLSTM\n", 1, "CuDNNLSTM: keras.layers.LSTM", True),
    ("from keras.layers.local import LocallyConnected2D\n", 1, "keras.layers.local: removed", True),
    ("m = keras.utils.multi_gpu_model(m, 2)\n", 1, "multi_gpu_model: removed", True),
    ("gen = keras.preprocessing.image.ImageDataGenerator()\n", 1, "tf.keras.preprocessing.image.ImageDataGenerator", True),
    ("from keras.preprocessing.image import ImageDataGenerator\n", 1, "ImageDataGenerator is deprecated", False),
    ("import horovod\nhorovod.run(main, np=2)\n", 2, "hvdk8s run -np N", False),
    ("model.fit_generator(g,\n  workers=4, use_multiprocessing=True)\n", 1, "keras.utils.PyDataset", False),
    # .h5 paths: the option's default is rewritten, but a path on the command line is not
    ("parser.add_argument(\n    '--ckpt',\n    default='m-{epoch}.h5')\ncb = ModelCheckpoint(args.ckpt)\n", 3,
     "--ckpt: default rewritten to .keras", False),
    # what migrate cannot decide is listed at the string's line, with the calls it reaches
    ("CKPT = 'model.h5'\ntrain(model, CKPT)\n", 1, "migrate cannot follow this HDF5 path", True),
    ("path = 'a.h5'\nif resume:\n    path = args.path\nmodel.save(path)\n", 1, "migrate cannot follow", True),
    ("import horovod.keras as hvd\nmodel = hvd.load_model('pretrained.h5')\n", 2,
     "'pretrained.h5' is loaded by hvd.load_model (line 2)", True),
    ("model = keras.models.load_model('pretrained.h5')\n", 1, "reads legacy HDF5 models for inference", False),
    ("cb = ModelCheckpoint('ck.h5',\n                     save_weights_only=args.weights)\n", 1,
     "save_weights_only (line 1) is not a literal", True),
    ("CK = 'ck.h5'\nmodel.save(CK)\nmodel.save_weights(CK)\n", 1, "saved both as a model and as weights (lines 2, 3)",
     True),
    ("model.save('m.weights.h5')\n", 1, "names a weights file but line 1 saves the whole model", True),
    ("import numpy as np\nnp.save('x.h5', a)\n", 2, "migrate cannot follow", True),
    ("model.save('m.h5')\nwith h5py.File('m.h5') as f:\n    print(f.attrs)\n", 2, "opened as HDF5 data (line 2)", True),
    ("class Saver(keras.callbacks.Callback):\n    def on_train_end(self, logs=None):\n"
     "        self.model.save(self.path)\n\nparser.add_argument('--path', default='final.h5')\n", 5,
     "migrate cannot follow", True),
    # a config used in a way migrate does not know is left whole and reported, with its session
    ("config = tf.ConfigProto()\nconfig.gpu_options.per_process_gpu_memory_fraction = 0.5\n"
     "K.set_session(tf.Session(config=config))\n", 1, "tf.ConfigProto: TF 1 session config", True),
]  # fmt: skip


@pytest.mark.parametrize("code,line,fragment,manual", FINDINGS)
def test_finding(code: str, line: int, fragment: str, manual: bool) -> None:
    result = migrate_source(code)
    assert [f for f in result.findings if fragment in f.message] == [
        Finding(line, next(f.message for f in result.findings if fragment in f.message), manual)
    ], result.findings
    assert result.manual == manual


@pytest.mark.parametrize("code", [
    "data = h5py.File('train.h5', 'r')\nframe = pd.read_hdf('frame.h5')\n",  # HDF5 data, not Keras
    "print('saved to model.h5')\n",  # a message, not a path
    "model.load_weights('pretrained.h5')\n",  # Keras 3 reads legacy .h5 weights
    "best = 'w.weights.h5'\n",  # Keras 3's own name for weights
    "cb = ModelCheckpoint(path)\nmodel.save(os.path.join(d, name))\n",  # nothing ending in .h5 to see
])  # fmt: skip
def test_h5_strings_that_are_no_checkpoint_are_left_alone(code: str) -> None:
    result = migrate_source(code)
    assert result.code == code and not result.findings, result.findings


def test_unknown_config_use_is_not_half_rewritten() -> None:
    code = FINDINGS[-1][0]
    result = migrate_source(code)
    assert result.code == code
    assert {f.line for f in result.findings} == {1, 3}  # ConfigProto and set_session/Session


def test_rewrite_targets_exist_in_keras3() -> None:
    import keras
    import tensorflow as tf
    from tensorflow.keras.preprocessing.image import ImageDataGenerator  # noqa: F401

    for target in set(LOSS_ALIASES.values()):
        assert callable(getattr(keras.losses, target)), target
    for name in ("mean_squared_error", "mean_absolute_error", "log_cosh", "kl_divergence"):
        assert callable(getattr(keras.metrics, name)), name
    for name in ("set_intra_op_parallelism_threads", "set_inter_op_parallelism_threads"):
        assert callable(getattr(tf.config.threading, name))
    assert tf.config.set_soft_device_placement and tf.debugging.set_log_device_placement
    assert keras.mixed_precision.Policy and tf.keras.mixed_precision.set_global_policy
    assert keras.ops.convert_to_numpy(keras.Variable(2.0)) == 2.0
    keras.callbacks.ModelCheckpoint("ck-{epoch}.keras")
    keras.callbacks.ModelCheckpoint("w-{epoch}.weights.h5", save_weights_only=True)
    for path, weights_only in (("ck-{epoch}.hdf5", False), ("w-{epoch}.h5", True)):  # what Keras 3 refuses outright
        with pytest.raises(ValueError, match="must end in"):
            keras.callbacks.ModelCheckpoint(path, save_weights_only=weights_only)


KERAS2_SCRIPT = '''\
import numpy as np
import tensorflow as tf
import keras
from keras import backend as K

config = tf.compat.v1.ConfigProto()
config.gpu_options.allow_growth = True
config.inter_op_parallelism_threads = 1
K.set_session(tf.compat.v1.Session(config=config))
tf.keras.mixed_precision.experimental.set_policy("float32")


class Batches(keras.utils.Sequence):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        rng = np.random.default_rng(i)
        return rng.normal(size=(8, 3)).astype("float32"), rng.normal(size=(8, 1)).astype("float32")


model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
opt = keras.optimizers.legacy.SGD(lr=0.01)
model.compile(optimizer=opt, loss=keras.losses.mse, experimental_run_tf_function=False)
history = model.fit_generator(Batches(), 2, 3, 0, workers=1, use_multiprocessing=False,
                              callbacks=[keras.callbacks.ModelCheckpoint("ckpt-{epoch}.h5")])
K.set_value(model.optimizer.lr, 0.5)
model.save_weights("final.h5")
print("epochs", len(history.history["loss"]), "lr", float(K.get_value(opt.lr)),
      "eval", np.ndim(model.evaluate_generator(Batches(), 2)), "pred", model.predict_generator(Batches(), 1).shape)
'''


def test_migrated_keras2_script_runs_on_keras3(tmp_path: Path) -> None:
    """The original fails on Keras 3; after migrate it runs, and the rewritten calls mean what they meant."""
    script = tmp_path / "keras2.py"
    script.write_text(KERAS2_SCRIPT)
    original = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert original.returncode != 0
    result = migrate_source(KERAS2_SCRIPT)
    assert not result.findings
    script.write_text(result.code)
    migrated = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr[-3000:]
    # fit_generator(gen, 2, 3, 0): 2 steps, 3 epochs, quiet; evaluate_generator returned a scalar loss
    assert "epochs 3 lr 0.5 eval 0 pred (8, 1)" in migrated.stdout
    assert sorted(p.name for p in tmp_path.glob("ckpt-*")) == ["ckpt-1.keras", "ckpt-2.keras", "ckpt-3.keras"]
    assert (tmp_path / "final.weights.h5").exists()


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([HVDK8S, "migrate", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def test_cli_prints_a_diff_that_patch_applies_and_leaves_the_file(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("import horovod.keras as hvd\nfrom keras.optimizers import SGD\nopt = SGD(lr=0.1)\n")
    proc = _cli("train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert script.read_text() == "import horovod.keras as hvd\nfrom keras.optimizers import SGD\nopt = SGD(lr=0.1)\n"
    assert proc.stdout.startswith("--- train.py\n+++ train.py\n")
    assert "-import horovod.keras as hvd\n" in proc.stdout and "+import hvdk8s as hvd\n" in proc.stdout
    subprocess.run(["patch", "-p0"], input=proc.stdout, cwd=tmp_path, check=True, capture_output=True, text=True)
    assert script.read_text() == "import hvdk8s as hvd\nfrom keras.optimizers import SGD\nopt = SGD(learning_rate=0.1)\n"


def test_cli_write_keeps_mode_and_line_endings_and_exits_1_for_manual_items(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(b"import horovod.keras as hvd\r\nsess = tf.Session()\r\n")
    script.chmod(0o755)
    proc = _cli("--write", "train.py", cwd=tmp_path)
    assert proc.returncode == migrate_cli.MANUAL_EXIT == 1
    assert proc.stdout == ""
    assert "train.py:2: manual: tf.Session: TF 1 sessions do not exist in TF 2" in proc.stderr
    assert script.read_bytes() == b"import hvdk8s as hvd\r\nsess = tf.Session()\r\n"
    assert os.stat(script).st_mode & 0o777 == 0o755
    assert [p.name for p in tmp_path.iterdir()] == ["train.py"]  # no temporary file left behind


def test_cli_bad_input_exits_2_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "py2.py").write_text("import horovod.keras as hvd\nprint 'hello'\n")
    proc = _cli("--write", "py2.py", cwd=tmp_path)
    assert proc.returncode == 2
    assert "py2.py:2: syntax error: Missing parentheses in call to 'print'" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert (tmp_path / "py2.py").read_text().startswith("import horovod.keras")
    proc = _cli("missing.py", cwd=tmp_path)
    assert proc.returncode == 2 and "missing.py: cannot read" in proc.stderr


# Scripts Python reads in an encoding of their own: (bytes before the Horovod import line, bytes after it).
ENCODED_SCRIPTS = {
    "bom.py": (b"\xef\xbb\xbf", b"hvd.init()\n"),  # a UTF-8 byte order mark
    "utf8.py": (b"# -*- coding: utf-8 -*-\n", b"s = 'caf\xc3\xa9'\n"),
    "latin1.py": (b"# -*- coding: latin-1 -*-\n", b"s = 'caf\xe9'  # d\xe9j\xe0 vu\n"),
}


def test_cli_keeps_a_scripts_bom_coding_cookie_and_encoding_in_the_diff_and_with_write(tmp_path: Path) -> None:
    def write_scripts(folder: Path) -> None:
        folder.mkdir()
        for name, (head, tail) in ENCODED_SCRIPTS.items():
            (folder / name).write_bytes(head + b"import horovod.keras as hvd\n" + tail)

    write_scripts(tmp_path / "diff")
    proc = subprocess.run([HVDK8S, "migrate", *ENCODED_SCRIPTS], cwd=tmp_path / "diff", capture_output=True, timeout=60)
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert proc.stdout == (  # each file's own bytes, BOM included, so that patch applies it
        b"--- bom.py\n+++ bom.py\n@@ -1,2 +1,2 @@\n"
        b"-\xef\xbb\xbfimport horovod.keras as hvd\n+\xef\xbb\xbfimport hvdk8s as hvd\n hvd.init()\n"
        b"--- utf8.py\n+++ utf8.py\n@@ -1,3 +1,3 @@\n"
        b" # -*- coding: utf-8 -*-\n-import horovod.keras as hvd\n+import hvdk8s as hvd\n s = 'caf\xc3\xa9'\n"
        b"--- latin1.py\n+++ latin1.py\n@@ -1,3 +1,3 @@\n"
        b" # -*- coding: latin-1 -*-\n-import horovod.keras as hvd\n+import hvdk8s as hvd\n"
        b" s = 'caf\xe9'  # d\xe9j\xe0 vu\n"
    )
    subprocess.run(["patch", "-p0"], input=proc.stdout, cwd=tmp_path / "diff", check=True, capture_output=True)
    write_scripts(tmp_path / "write")
    proc = subprocess.run([HVDK8S, "migrate", "--write", *ENCODED_SCRIPTS], cwd=tmp_path / "write",
                          capture_output=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0, b"", b"bom.py: rewritten\nutf8.py: rewritten\nlatin1.py: rewritten\n")
    for name, (head, tail) in ENCODED_SCRIPTS.items():
        migrated = head + b"import hvdk8s as hvd\n" + tail
        assert (tmp_path / "diff" / name).read_bytes() == (tmp_path / "write" / name).read_bytes() == migrated


def test_cli_refuses_a_script_not_in_its_encoding(tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_bytes(b"# -*- coding: utf-8 -*-\nimport horovod.keras as hvd\ns = 'caf\xe9'\n")
    (tmp_path / "odd.py").write_bytes(b"# -*- coding: klingon -*-\nimport horovod.keras as hvd\n")
    (tmp_path / "bom.py").write_bytes(b"\xef\xbb\xbfimport horovod.keras as hvd\nx = 1\ns = '\xff'\n")
    for name, message in [
        ("bom.py", "bom.py:3: cannot read: byte 0xff is not utf-8-sig (invalid start byte); Python reads a file "
                   "as UTF-8 unless a coding cookie (PEP 263) names its encoding"),  # counted after the BOM
        ("bad.py", "bad.py:3: cannot read: byte 0xe9 is not utf-8 (invalid continuation byte); Python reads a file "
                   "as UTF-8 unless a coding cookie (PEP 263) names its encoding"),
        ("odd.py", "odd.py: cannot read: unknown encoding: klingon"),
    ]:
        proc = _cli("--write", name, cwd=tmp_path)
        assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", f"hvdk8s migrate: error: {message}\n")
    assert (tmp_path / "bad.py").read_bytes() == b"# -*- coding: utf-8 -*-\nimport horovod.keras as hvd\ns = 'caf\xe9'\n"


def test_cli_checks_every_file_before_writing_any(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text("import horovod.keras as hvd\n")
    (tmp_path / "bad.py").write_text("def (:\n")
    assert _cli("--write", "good.py", "bad.py", cwd=tmp_path).returncode == 2
    assert (tmp_path / "good.py").read_text() == "import horovod.keras as hvd\n"


def test_cli_write_that_fails_exits_2_and_renames_nothing(tmp_path: Path) -> None:
    """A file migrate cannot write: one line, exit status 2, and no other file rewritten. The tests run as root,
    which writes through permissions, so the failure is a name with no room for its temporary beside it
    (``.tmp-<stem>-<8 hex>.py``: over the 255 bytes a name may have)."""
    (tmp_path / "good.py").write_text("import horovod.keras as hvd\n")
    long = "a" * 250 + ".py"
    (tmp_path / long).write_text("import horovod.keras as hvd\n")
    proc = _cli("--write", "good.py", long, cwd=tmp_path)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"hvdk8s migrate: error: {long}: cannot write: File name too long\n")
    assert (tmp_path / "good.py").read_text() == "import horovod.keras as hvd\n"  # its new version was not renamed in
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["good.py", long])  # no temporary left behind


def test_without_libcst_the_cli_runs_and_migrate_says_what_to_install(tmp_path: Path) -> None:
    # libcst is the optional extra hvdk8s[migrate]: the CLI (and `import hvdk8s`) must not need it.
    (tmp_path / "train.py").write_text("import horovod.keras as hvd\n")
    no_libcst = ("import sys; sys.modules['libcst'] = None; from hvdk8s.cli import main; "
                 "sys.exit(main(sys.argv[1:]))")
    help_proc = subprocess.run([sys.executable, "-c", no_libcst, "--help"], cwd=tmp_path, capture_output=True,
                               text=True, timeout=60)
    assert help_proc.returncode == 0 and "migrate" in help_proc.stdout, help_proc.stderr
    proc = subprocess.run([sys.executable, "-c", no_libcst, "migrate", "train.py"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", "hvdk8s migrate: error: needs libcst, an optional extra: pip install 'hvdk8s[migrate]'\n")
