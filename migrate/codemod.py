"""The ``hvdk8s migrate`` codemod: rewrite a Horovod Keras 2 script for hvdk8s on Keras 3.

A libcst codemod, so comments and formatting survive. Each rule is a mechanical
change to a Keras 3 target that ``tests/test_migrate.py`` asserts exists: in
``make test`` on Keras 3.15 / TensorFlow 2.21, and by hand on the oldest stack,
Keras 3.8 / TensorFlow 2.18 (2026-11-29, all passed). What cannot be rewritten
safely is returned as a ``Finding`` with its line and the Keras 3 code to use.
"""
from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor
from libcst.metadata import MetadataWrapper, PositionProvider

HOROVOD_KERAS = ("horovod.tensorflow.keras", "horovod.keras")
OPTIMIZERS = frozenset(
    {"SGD", "Adam", "Adadelta", "Adagrad", "Adamax", "Nadam", "RMSprop", "Ftrl", "AdamW", "Lion", "Lamb", "Adafactor"}
)
# Where Keras optimizers live (imports resolved): torch.optim.Adam(lr=) and others keep their lr=.
KERAS_OPTIMIZER_MODULES = ("keras.optimizers.", "tf.keras.optimizers.", "tensorflow.keras.optimizers.",
                           "tf_keras.optimizers.")
# Keras 2 positional parameters of the *_generator methods: Keras 3's fit/evaluate/predict order theirs differently.
GENERATOR_METHODS = {
    "fit_generator": ("fit", ("generator", "steps_per_epoch", "epochs", "verbose", "callbacks", "validation_data",
                              "validation_steps", "validation_freq", "class_weight", "max_queue_size", "workers",
                              "use_multiprocessing", "shuffle", "initial_epoch")),
    "evaluate_generator": ("evaluate", ("generator", "steps", "callbacks", "max_queue_size", "workers",
                                        "use_multiprocessing", "verbose")),
    "predict_generator": ("predict", ("generator", "steps", "callbacks", "max_queue_size", "workers",
                                      "use_multiprocessing", "verbose")),
}  # fmt: skip
# Keras 3 fit/evaluate/predict lack these; keras.utils.PyDataset(workers=, use_multiprocessing=, max_queue_size=) has them.
QUEUE_ARGS = frozenset({"max_queue_size", "workers", "use_multiprocessing"})
# Keras 2 short names of loss/metric functions that Keras 3 only has under their long names.
LOSS_ALIASES = {
    "mse": "mean_squared_error", "MSE": "mean_squared_error",
    "mae": "mean_absolute_error", "MAE": "mean_absolute_error",
    "msle": "mean_squared_logarithmic_error", "MSLE": "mean_squared_logarithmic_error",
    "mape": "mean_absolute_percentage_error", "MAPE": "mean_absolute_percentage_error",
    "kld": "kl_divergence", "KLD": "kl_divergence", "kullback_leibler_divergence": "kl_divergence",
    "logcosh": "log_cosh",
}  # fmt: skip
# Keras 2 modules of keras.layers whose public names Keras 3 has directly in keras.layers.
LAYER_SUBMODULES = frozenset(
    {"core", "convolutional", "pooling", "recurrent", "normalization", "embeddings", "advanced_activations", "noise",
     "merge", "wrappers"}
)  # fmt: skip
# Imports that find ImageDataGenerator in Keras 3.8 only from tf.keras: (module, imported name).
LEGACY_IMAGE = frozenset({("keras.preprocessing.image", "ImageDataGenerator"), ("keras.preprocessing", "image")})
# ConfigProto fields with a global tf.config equivalent (TF 2 has no sessions to configure).
CONFIG_CALLS = {
    "intra_op_parallelism_threads": "{tf}.config.threading.set_intra_op_parallelism_threads({value})",
    "inter_op_parallelism_threads": "{tf}.config.threading.set_inter_op_parallelism_threads({value})",
    "allow_soft_placement": "{tf}.config.set_soft_device_placement({value})",
    "log_device_placement": "{tf}.debugging.set_log_device_placement({value})",
}
# Removed or private Keras 2 / TF 1 modules: (dotted prefix, what to use instead).
MANUAL_MODULES = (
    ("keras.engine", "private Keras 2 module: use the public keras.* API (keras.Model, keras.layers.Layer, keras.Input)"),
    ("tensorflow.python.keras", "TensorFlow's private Keras 2 copy: use the public keras.* API"),
    ("keras.layers.local", "removed in Keras 3 (LocallyConnected1D/2D): a Conv with unshared weights is not built in"),
    ("keras.backend.tensorflow_backend", "removed: Keras 3 has no TF 1 session backend; device settings via tf.config"),
    ("keras.wrappers", "removed in Keras 3: use SciKeras (scikeras.wrappers.KerasClassifier)"),
    ("keras.preprocessing.text", "deprecated: keras.layers.TextVectorization"),
)
# Names (last component of an attribute chain) that Keras 3 / TF 2 lack: suggestion, and whether it is only a note.
MANUAL_NAMES = {
    "Session": "TF 1 sessions do not exist in TF 2: run eagerly (or in a tf.function); device settings via tf.config",
    "ConfigProto": "TF 1 session config: tf.config.experimental.set_memory_growth / tf.config.set_visible_devices / "
    "tf.config.threading.set_intra_op_parallelism_threads",
    "get_session": "Keras 3 has no session: run eagerly; device settings via tf.config",
    "set_session": "Keras 3 has no session: device settings via tf.config",
    "placeholder": "TF 1 placeholders: pass tensors to a tf.function or use keras.Input",
    "multi_gpu_model": "removed: hvdk8s gives each rank one GPU (DistributedOptimizer); in one process "
    "tf.distribute.MirroredStrategy",
    "CuDNNLSTM": "keras.layers.LSTM (uses cuDNN on GPU when its arguments allow)",
    "CuDNNGRU": "keras.layers.GRU(reset_after=True) (uses cuDNN on GPU when its arguments allow)",
}
NOTES = {
    "ImageDataGenerator": "ImageDataGenerator is deprecated in Keras 3 (it runs from tf.keras's legacy copy): "
    "move to tf.data with keras.layers.RandomRotation/RandomTranslation/RandomZoom/RandomShear",
    "horovod.run": "horovod.run still works (it is Horovod's launcher); the hvdk8s way is "
    "`hvdk8s run -np N script.py` (or an MPIJob)",
}
# Checkpoint paths. Keras 3.8 and 3.15 (checked): ModelCheckpoint saving models takes .keras and .h5 (refusing
# .hdf5), saving weights only .weights.h5; a model saved as .h5 is legacy HDF5, which keras.models.load_model reads
# with an optimizer built for no variables, so training it on fails ("Unknown variable"): a checkpoint to resume from
# must be .keras, and hvdk8s.load_model refuses .h5 models.
H5_SUFFIXES = (".h5", ".hdf5")
NEW_SUFFIX = {"model": ".keras", "weights": ".weights.h5"}
# Calls with a model or weights path: callee -> (position of the path, what the call does with the file). Their
# keyword is ``filepath``; ``save`` counts only as a method not of a module (model.save, not np.save or wandb.save);
# ModelCheckpoint saves weights with save_weights_only=True (position 4).
PATH_CALLS = {
    "ModelCheckpoint": (0, "model"), "save": (0, "model"), "save_model": (1, "model"),
    "save_weights": (0, "weights"), "load_model": (0, "load"), "load_weights": (0, "load_weights"),
}  # fmt: skip
WRITES = frozenset({"model", "weights", "either"})
# Calls that read or write HDF5 data (not Keras files): an .h5 path passed to them is nobody's checkpoint.
H5_DATA_CALLS = frozenset({"File", "read_hdf", "to_hdf", "HDFStore", "open_file"})  # h5py, pandas, PyTables
# Calls a path goes through unchanged in its suffix: the path is their last (join) or only argument.
PATH_WRAPPERS = frozenset(
    {"join", "str", "Path", "PurePath", "expanduser", "abspath", "realpath", "normpath", "fspath"}
)
PATH_NOTES = {
    "option": "{option}: default rewritten to {suffix} (Keras 3 {why}): a path given on the command line must end "
    "in {suffix} too, and .h5 files of earlier runs are not found by it",
    "both": "{path} is saved both as a model and as weights (lines {lines}): Keras 3 wants .keras for models and "
    ".weights.h5 for weights, so give each its own path",
    "either": "{path}: ModelCheckpoint's save_weights_only (line {lines}) is not a literal: the path must end in "
    ".weights.h5 when it saves weights and in .keras when it saves the model",
    "weights as model": "{path} names a weights file but line {lines} saves the whole model there: Keras 3 writes "
    "it as legacy HDF5, which it cannot resume training from; use a .keras path",
    "hvd load": "{path} is loaded by hvd.load_model (line {lines}): a legacy HDF5 model, which Keras 3 cannot resume "
    "training from (hvd.load_model refuses it): write checkpoints as .keras (ModelCheckpoint, model.save) and "
    "load those",
    "keras load": "{path} is loaded by load_model (line {lines}): Keras 3 reads legacy HDF5 models for inference "
    "(compile=False) but cannot train one on with its saved optimizer; re-save it once as .keras",
    "data": "{path} is opened as HDF5 data (line {lines}), but the script saves it as a Keras file, which migrate "
    "renames: Keras 3 writes .keras files as zip archives; read the model with keras.models.load_model",
    "unfollowed": "{path}: migrate cannot follow this HDF5 path to a Keras call: a model checkpoint must end in "
    ".keras on Keras 3 (an .h5 model is legacy HDF5, which Keras 3 cannot resume training from and hvd.load_model "
    "refuses), a weights file in .weights.h5",
}


@dataclass(frozen=True)
class Finding:
    """Something ``migrate`` left alone: ``manual`` ones stop the script from running on Keras 3."""

    line: int
    message: str
    manual: bool = True


@dataclass(frozen=True)
class Result:
    code: str
    findings: tuple[Finding, ...]

    @property
    def manual(self) -> bool:
        return any(f.manual for f in self.findings)


def migrate_source(code: str, filename: str = "<script>") -> Result:
    """The migrated ``code`` and what is left to do by hand. Raises ``SyntaxError`` (with its line)."""
    ast.parse(code, filename)  # Python's own message ("Missing parentheses in call to 'print'") beats the CST parser's
    wrapper = MetadataWrapper(cst.parse_module(code))
    scan = _Scan()
    wrapper.module.visit(scan)
    migrator = _Migrator(scan)
    module = wrapper.visit(migrator)
    if migrator.needs_keras:
        context = CodemodContext()
        AddImportsVisitor.add_needed_import(context, "keras")
        module = AddImportsVisitor(context).transform_module(module)
    return Result(module.code, migrator.findings())


def dotted(node: cst.CSTNode) -> str | None:
    """``a.b.c`` for a chain of names and attributes, else None (calls and subscripts break the chain)."""
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        base = dotted(node.value)
        return f"{base}.{node.attr.value}" if base else None
    return None


def _hvdk8s_module(name: str) -> str | None:
    for prefix in HOROVOD_KERAS:
        if name == prefix or name.startswith(prefix + "."):
            return "hvdk8s" + name[len(prefix):]
    return None


def _name_node(name: str) -> cst.Attribute | cst.Name:
    return cst.parse_expression(name)  # type: ignore[return-value]


def _code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)


def _callee(call: cst.Call) -> str:
    """The called name's last component (``fit`` for ``model.fit(...)``), '' for other callees."""
    if isinstance(call.func, cst.Name):
        return call.func.value
    return call.func.attr.value if isinstance(call.func, cst.Attribute) else ""


def _is_backend(name: str | None, aliases: set[str]) -> bool:
    return name is not None and (name in aliases or name.endswith("keras.backend"))


@dataclass
class _ConfigStatement:
    """A statement that only creates, sets or applies a TF 1 ``ConfigProto`` named ``config``."""

    config: str  # '' for a config built inline: set_session(Session(config=ConfigProto(...)))
    kind: str  # create | growth | visible | call | apply | inline
    value: cst.BaseExpression | None = None
    field: str = ""
    tf: str = "tf"
    settings: tuple[tuple[str, cst.BaseExpression], ...] = ()  # ConfigProto(...)'s keyword arguments


class _Scan(cst.CSTVisitor):
    """First pass: names bound to optimizers and to the Keras backend, and the TF 1 config statements."""

    def __init__(self) -> None:
        self.optimizers: set[str] = {"opt", "optimizer"}
        self.backends: set[str] = set()
        self.names: Counter[str] = Counter()  # references to each variable (attribute names excluded)
        self.config_statements: dict[cst.SimpleStatementLine, _ConfigStatement] = {}
        self._not_variables: set[int] = set()
        self.bindings: Counter[str] = Counter()  # how often each name is bound (assigned, a parameter, imported ...)
        self.values: dict[str, cst.BaseExpression] = {}  # the value (or parameter default) a name is bound to
        self.options: dict[str, list[tuple[str, cst.BaseExpression]]] = {}  # argparse dest / absl flag: (flag, default)
        self.horovod: set[str] = set()  # names bound to Horovod or hvdk8s modules and functions
        self.modules: set[str] = set()  # names bound by ``import``: np.save or wandb.save saves no Keras model
        self.imported: dict[str, str] = {}  # name an import binds -> what it names (tf -> tensorflow)
        self.path_calls: list[tuple[cst.Call, cst.BaseExpression, str]] = []  # (call, its path argument, kind)
        self.h5_strings: list[cst.CSTNode] = []  # strings (or f-strings' closing text) ending in .h5 / .hdf5

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self._not_variables.add(id(node.attr))

    def visit_Arg(self, node: cst.Arg) -> None:
        if node.keyword is not None:
            self._not_variables.add(id(node.keyword))

    def visit_Name(self, node: cst.Name) -> None:
        if id(node) not in self._not_variables:
            self.names[node.value] += 1

    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            name = dotted(alias.name) or ""
            bound = alias.asname.name.value if alias.asname else name  # type: ignore[union-attr]
            self.bindings[bound.partition(".")[0]] += 1
            self.modules.add(bound.partition(".")[0])
            if alias.asname:
                self.imported[bound] = name
            if alias.asname and name.endswith("keras.backend"):
                self.backends.add(bound)
            if name.split(".")[0] in ("horovod", "hvdk8s"):
                self.horovod.add(bound)

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        module = dotted(node.module) if node.module else ""
        if isinstance(node.names, cst.ImportStar):
            if f"{module}.".startswith(KERAS_OPTIMIZER_MODULES) and not node.relative:
                self.imported |= {name: f"{module}.{name}" for name in OPTIMIZERS}
            return
        for alias in node.names:
            bound = alias.asname.name.value if alias.asname else dotted(alias.name) or ""  # type: ignore[union-attr]
            self.bindings[bound] += 1
            if module and not node.relative:
                self.imported[bound] = f"{module}.{dotted(alias.name)}"
            if module and module.endswith("keras") and dotted(alias.name) == "backend":
                self.backends.add(bound)
            if module and module.split(".")[0] in ("horovod", "hvdk8s"):
                self.horovod.add(bound)

    def visit_Assign(self, node: cst.Assign) -> None:
        for target in node.targets:
            self._bind(target.target, node.value if len(node.targets) == 1 else None)
        if len(node.targets) == 1 and isinstance(node.targets[0].target, cst.Name) and isinstance(node.value, cst.Call):
            call = node.value
            if self.keras_optimizer(call) or _callee(call) == "DistributedOptimizer":
                self.optimizers.add(node.targets[0].target.value)

    def keras_optimizer(self, call: cst.Call) -> bool:
        """``call`` makes a Keras optimizer: ``keras.optimizers.Adam(...)``, ``tf.keras.optimizers.legacy.SGD``,
        or a name imported from one of those modules (not ``torch.optim.Adam``, nor an unknown ``Adam``)."""
        head, dot, rest = (dotted(call.func) or "").partition(".")
        name = self.imported.get(head, head) + dot + rest
        return name.startswith(KERAS_OPTIMIZER_MODULES) and name.rpartition(".")[2] in OPTIMIZERS

    # --- names bound, for following a path to its string ------------------------------------------------
    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression | None) -> None:
        if isinstance(target, cst.Name):
            self.bindings[target.value] += 1
            if value is not None:
                self.values[target.value] = value
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._bind(element.value, None)
        elif isinstance(target, cst.StarredElement):
            self._bind(target.value, None)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._bind(node.target, node.value)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._bind(node.target, None)

    def visit_For(self, node: cst.For) -> None:
        self._bind(node.target, None)

    def visit_CompFor(self, node: cst.CompFor) -> None:
        self._bind(node.target, None)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._bind(node.asname.name, None)

    def visit_ExceptHandler(self, node: cst.ExceptHandler) -> None:
        if node.name is not None:
            self._bind(node.name.name, None)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._bind(node.target, None)

    def visit_Param(self, node: cst.Param) -> None:
        self._bind(node.name, node.default)  # a parameter's default is the path when callers pass none

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._bind(node.name, None)

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._bind(node.name, None)

    def visit_SimpleString(self, node: cst.SimpleString) -> None:
        if (text := _string_text(node)) and text.endswith(H5_SUFFIXES):
            self.h5_strings.append(node)

    def visit_FormattedString(self, node: cst.FormattedString) -> None:
        last = node.parts[-1] if node.parts else None
        if isinstance(last, cst.FormattedStringText) and last.value.endswith(H5_SUFFIXES):
            self.h5_strings.append(last)

    def visit_Call(self, node: cst.Call) -> None:
        name = _callee(node)
        if name == "add_argument" and (default := _kwarg(node.args, "default")) is not None:
            strings = [a.value for a in node.args if a.keyword is None and isinstance(a.value, cst.SimpleString)]
            flags = [string.evaluated_value for string in strings]
            dest = _kwarg(node.args, "dest")
            long = next((f for f in flags if isinstance(f, str) and f.startswith("--")), None)
            first = flags[0] if flags and isinstance(flags[0], str) else None
            if isinstance(dest, cst.SimpleString) and isinstance(dest.evaluated_value, str):
                key = dest.evaluated_value
            elif first is not None:
                key = (long or first).lstrip("-").replace("-", "_")
            else:
                return
            self.options.setdefault(key, []).append((long or first or key, default))
        elif name.startswith("DEFINE_") and node.args and isinstance(flag := node.args[0].value, cst.SimpleString):
            default = _kwarg(node.args, "default") or (node.args[1].value if len(node.args) > 1 else None)
            if isinstance(flag.evaluated_value, str) and default is not None:
                self.options.setdefault(flag.evaluated_value, []).append(("--" + flag.evaluated_value, default))
        elif name in PATH_CALLS and (name != "save" or self._is_model_save(node.func)):
            position, kind = PATH_CALLS[name]
            path = _kwarg(node.args, "filepath")
            positional = [a.value for a in node.args if a.keyword is None and not a.star]
            if path is None and len(positional) > position:
                path = positional[position]
            if path is None:
                return
            if name == "ModelCheckpoint":
                weights_only = _kwarg(node.args, "save_weights_only")
                if weights_only is None and len(positional) > 4:
                    weights_only = positional[4]
                model = weights_only is None or _is_false(weights_only)
                kind = "weights" if _is_true(weights_only) else "model" if model else "either"
            elif name == "load_model" and self._is_horovod(node.func):
                kind = "hvd load"
            self.path_calls.append((node, path, kind))
        elif name in H5_DATA_CALLS:
            if node.args:
                self.path_calls.append((node, node.args[0].value, "data"))

    def _is_model_save(self, func: cst.BaseExpression) -> bool:
        """``x.save(...)`` on something that is not an imported module (model.save, self.model.save)."""
        root = func.value if isinstance(func, cst.Attribute) else None
        while isinstance(root, cst.Attribute):
            root = root.value
        return root is not None and not (isinstance(root, cst.Name) and root.value in self.modules)

    def _is_horovod(self, func: cst.BaseExpression) -> bool:
        name = dotted(func) or ""
        return name in self.horovod or any(name.startswith(h + ".") for h in self.horovod)

    def path_strings(self, node: cst.BaseExpression, depth: int = 0) -> list[cst.CSTNode] | None:
        """The string nodes whose text ends the path ``node`` evaluates to (a literal, the text closing an f-string,
        a variable's only value, an argparse default ...), None when migrate cannot tell."""
        if depth > 20:
            return None
        if isinstance(node, cst.SimpleString):
            return [node]
        if isinstance(node, cst.ConcatenatedString):
            return self.path_strings(node.right, depth + 1)
        if isinstance(node, cst.FormattedString):
            last = node.parts[-1] if node.parts else None
            return [last] if isinstance(last, cst.FormattedStringText) else None
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, (cst.Add, cst.Divide)):
                return self.path_strings(node.right, depth + 1)
            if isinstance(node.operator, cst.Modulo):
                return self.path_strings(node.left, depth + 1)
            return None
        if isinstance(node, cst.Call):
            positional = [a.value for a in node.args if a.keyword is None and not a.star]
            if isinstance(node.func, cst.Attribute) and node.func.attr.value == "format":
                return self.path_strings(node.func.value, depth + 1)
            if _callee(node) in PATH_WRAPPERS and positional and len(positional) == len(node.args):
                return self.path_strings(positional[-1], depth + 1)
            return None
        if isinstance(node, cst.Name):
            if self.bindings[node.value] == 1 and node.value in self.values:
                return self.path_strings(self.values[node.value], depth + 1)
            return None
        if isinstance(node, cst.Attribute) and isinstance(node.value, cst.Name) and node.attr.value in self.options:
            if node.value.value in ("self", "cls"):  # an object's attribute, not args.checkpoint_format
                return None
            found: list[cst.CSTNode] = []
            for _, default in self.options[node.attr.value]:
                strings = self.path_strings(default, depth + 1)
                if strings is None:
                    return None
                found += strings
            return found
        return None

    def option_strings(self) -> dict[cst.CSTNode, str]:
        """Strings that end a command-line option's default path (argparse, absl flags), with the option."""
        found: dict[cst.CSTNode, str] = {}
        for options in self.options.values():
            for flag, default in options:
                for string in self.path_strings(default) or []:
                    found[string] = flag
        return found

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        if len(node.body) == 1 and (found := _config_statement(node.body[0])):
            self.config_statements[node] = found

    @property
    def gpu_configs(self) -> set[str]:
        """Configs with GPU options: their rewrite needs the list of GPUs."""
        return {s.config for s in self.config_statements.values() if s.kind in ("growth", "visible")}

    def convertible_configs(self) -> dict[str, str]:
        """Config names whose every use is a statement ``_Migrator`` can rewrite, with their TF module name."""
        uses: Counter[str] = Counter(s.config for s in self.config_statements.values())
        created = {s.config: s.tf for s in self.config_statements.values() if s.kind == "create"}
        return {name: tf for name, tf in created.items() if uses[name] == self.names[name]}

    def free_name(self, *candidates: str) -> str:
        return next(c for c in candidates if c not in self.names)


@dataclass
class _PathPlan:
    """What happens to each string ending a model or weights path (or ending in .h5 anywhere)."""

    rewrites: dict[cst.CSTNode, str]  # string -> "model" | "weights": its suffix becomes NEW_SUFFIX[...]
    reports: dict[cst.CSTNode, tuple[str, list[cst.Call]]]  # string -> (PATH_NOTES key, the calls it reaches)
    options: dict[cst.CSTNode, str]  # strings ending an option's default path -> the option


def _plan_paths(scan: _Scan) -> _PathPlan:
    """Rewrite an .h5 string only where every call it reaches agrees on what the file is: saved as a model (.keras)
    or as weights (.weights.h5), with reads of the same file following. Everything else ending in .h5 is listed."""
    reach: dict[cst.CSTNode, list[tuple[str, cst.Call]]] = {}
    for call, path, kind in scan.path_calls:
        for string in scan.path_strings(path) or []:
            reach.setdefault(string, []).append((kind, call))
    plan = _PathPlan({}, {}, scan.option_strings())
    templates: list[tuple[re.Pattern[str], str]] = []
    for string in scan.h5_strings:
        uses = reach.get(string, [])
        writes = {kind for kind, _ in uses} & WRITES
        calls = [call for kind, call in uses if kind in WRITES]
        text = _string_text(string) or ""
        if "either" in writes:
            plan.reports[string] = ("either", calls)
        elif writes == {"model", "weights"}:
            plan.reports[string] = ("both", calls)
        elif writes == {"model"} and text.endswith(".weights.h5"):
            plan.reports[string] = ("weights as model", calls)
        elif writes and not text.endswith(".weights.h5"):
            plan.rewrites[string] = writes.pop()
            templates.append((_template(text), plan.rewrites[string]))
    for string in scan.h5_strings:
        if string in plan.rewrites or string in plan.reports:
            continue
        text = _string_text(string) or ""
        kinds = {kind for kind, _ in reach.get(string, [])}
        match = next((kind for template, kind in templates if template.fullmatch(text)), None)
        if match and "data" in kinds:
            plan.reports[string] = ("data", [call for kind, call in reach[string] if kind == "data"])
        elif match:
            plan.rewrites[string] = match  # the same file, read (or tested for) where the script saved it
        elif "hvd load" in kinds or "load" in kinds:
            key = "hvd load" if "hvd load" in kinds else "keras load"
            plan.reports[string] = (key, [call for kind, call in reach[string] if kind in ("hvd load", "load")])
        elif not kinds and not text.endswith(".weights.h5") and not any(c.isspace() for c in text):
            plan.reports[string] = ("unfollowed", [])
    return plan


def _string_text(node: cst.CSTNode) -> str | None:
    """The text of a (non-bytes) string literal or of an f-string's text part, as written (escapes kept)."""
    if isinstance(node, cst.FormattedStringText):
        return node.value
    if isinstance(node, cst.SimpleString) and "b" not in node.prefix.lower():
        return node.value[len(node.prefix) + len(node.quote) : -len(node.quote)]
    return None


def _template(text: str) -> re.Pattern[str]:
    """A path template's file names: each ``{field}`` (str.format) matches any text."""
    return re.compile(".+".join(re.escape(part) for part in re.split(r"\{[^{}]*\}", text)))


def _with_suffix(node: cst.CSTNode, suffix: str) -> cst.CSTNode:
    text = _string_text(node) or ""
    old = next(s for s in H5_SUFFIXES if text.endswith(s))
    if isinstance(node, cst.FormattedStringText):
        return node.with_changes(value=text[: -len(old)] + suffix)
    assert isinstance(node, cst.SimpleString)
    return node.with_changes(value=node.prefix + node.quote + text[: -len(old)] + suffix + node.quote)


def _config_statement(stmt: cst.BaseSmallStatement) -> _ConfigStatement | None:
    if isinstance(stmt, cst.Assign) and len(stmt.targets) == 1:
        target = dotted(stmt.targets[0].target) or ""
        value = stmt.value
        if "." not in target and (created := _config_proto(value)):
            return _ConfigStatement(target, "create", tf=created[0], settings=created[1])
        head, _, field = target.partition(".")
        if field == "gpu_options.allow_growth":
            return _ConfigStatement(head, "growth", value)
        if field == "gpu_options.visible_device_list":
            return _ConfigStatement(head, "visible", value)
        if field in CONFIG_CALLS:
            return _ConfigStatement(head, "call", value, field)
    if isinstance(stmt, cst.Expr) and isinstance(stmt.value, cst.Call) and _callee(stmt.value) == "set_session":
        args = stmt.value.args
        if len(args) == 1 and isinstance(session := args[0].value, cst.Call) and _callee(session) == "Session":
            kw = session.args
            if len(kw) == 1 and _keyword(kw[0]) == "config" and isinstance(kw[0].value, cst.Name):
                return _ConfigStatement(kw[0].value.value, "apply")
            if len(kw) == 1 and _keyword(kw[0]) == "config" and (created := _config_proto(kw[0].value)):
                return _ConfigStatement("", "inline", tf=created[0], settings=created[1])
    return None


def _config_proto(node: cst.BaseExpression) -> tuple[str, tuple[tuple[str, cst.BaseExpression], ...]] | None:
    """For ``tf.ConfigProto(...)`` whose arguments all have a tf.config equivalent: the TF module name, the arguments."""
    func = (dotted(node.func) or "") if isinstance(node, cst.Call) else ""
    if not func.endswith(".ConfigProto"):
        return None
    settings = tuple((_keyword(a) or "", a.value) for a in node.args)  # type: ignore[attr-defined]
    if all(field in CONFIG_CALLS or (field == "device_count" and _no_gpus(value)) for field, value in settings):
        return func.split(".")[0], settings
    return None


def _no_gpus(node: cst.BaseExpression) -> bool:
    return _code(node).replace(" ", "").replace('"', "'") == "{'GPU':0}"


def _setting(field: str, value: cst.BaseExpression, tf: str) -> str:
    """The tf.config statement for one ConfigProto field."""
    if field == "device_count":  # {'GPU': 0}: no GPU for this process
        return f'{tf}.config.set_visible_devices([], "GPU")\n'
    return CONFIG_CALLS[field].format(tf=tf, value=_code(value)) + "\n"


class _Migrator(cst.CSTTransformer):
    METADATA_DEPENDENCIES = (PositionProvider,)

    def __init__(self, scan: _Scan) -> None:
        super().__init__()
        self.scan = scan
        self.configs = scan.convertible_configs()
        self.gpus = scan.free_name("gpus", "_gpus", "hvdk8s_gpus")
        self.gpu = scan.free_name("gpu", "_gpu", "hvdk8s_gpu")
        self.needs_keras = False
        self._findings: list[Finding] = []
        self._rewritten_lines: set[int] = set()  # statements replaced whole: their findings no longer apply
        self._drop: set[int] = set()  # ids of statements to remove once their block is rebuilt
        self.paths = _plan_paths(scan)

    def findings(self) -> tuple[Finding, ...]:
        kept = {f for f in self._findings if f.line not in self._rewritten_lines}
        return tuple(sorted(kept, key=lambda f: (f.line, f.message)))

    def _line(self, node: cst.CSTNode) -> int:
        return self.get_metadata(PositionProvider, node).start.line

    def _report(self, node: cst.CSTNode, message: str, manual: bool = True) -> None:
        self._findings.append(Finding(self._line(node), message, manual))

    # --- imports ---------------------------------------------------------------------------------
    # Module names inside imports are attribute chains: leave_Attribute has already rewritten them.
    def leave_Import(self, original: cst.Import, updated: cst.Import) -> cst.Import:
        for alias in original.names:
            self._check_module(original, dotted(alias.name) or "")
        return updated

    def leave_ImportFrom(self, original: cst.ImportFrom, updated: cst.ImportFrom) -> cst.ImportFrom:
        if updated.module is None or updated.relative:
            return updated
        module = dotted(updated.module) or ""
        imported = () if isinstance(updated.names, cst.ImportStar) else [dotted(a.name) for a in updated.names]
        self._check_module(original, dotted(original.module) or "")  # type: ignore[arg-type]
        for name in imported:
            if name in MANUAL_NAMES:
                self._report(original, f"{name}: {MANUAL_NAMES[name]}")
        if (module, "ImageDataGenerator") in LEGACY_IMAGE or (module, "image") in LEGACY_IMAGE:
            self._report(original, NOTES["ImageDataGenerator"], manual=False)
            return updated.with_changes(module=_name_node("tensorflow." + module))  # Keras 3.8 keeps it in tf.keras
        return updated

    def _check_module(self, node: cst.CSTNode, module: str) -> None:
        for prefix, suggestion in MANUAL_MODULES:
            if module == prefix or module.startswith(prefix + "."):
                self._report(node, f"{prefix}: {suggestion}")

    # --- names and attributes ----------------------------------------------------------------------
    def leave_Attribute(self, original: cst.Attribute, updated: cst.Attribute) -> cst.BaseExpression:
        attr = updated.attr.value
        base = dotted(updated.value) or ""
        if target := _hvdk8s_module(dotted(updated) or ""):
            return _name_node(target)
        if attr in ("legacy", "experimental") and base.endswith("optimizers"):
            return updated.value  # keras.optimizers.legacy.Adam -> keras.optimizers.Adam
        if (attr in LAYER_SUBMODULES and base.endswith("keras.layers")) or (attr == "np_utils" and base.endswith("keras.utils")):
            return updated.value  # keras.layers.core.Dense -> keras.layers.Dense
        if attr == "experimental" and base.endswith("mixed_precision"):
            return updated.value
        if attr == "set_policy" and base.endswith("mixed_precision"):
            return updated.with_changes(attr=cst.Name("set_global_policy"))
        if attr in LOSS_ALIASES and base.rpartition(".")[2] in ("losses", "metrics"):
            return updated.with_changes(attr=cst.Name(LOSS_ALIASES[attr]))
        if attr == "lr" and self._is_optimizer(updated.value):
            return updated.with_changes(attr=cst.Name("learning_rate"))
        full = f"{base}.{attr}"
        if full == "horovod.run":
            self._report(original, NOTES["horovod.run"], manual=False)
        elif attr == "ImageDataGenerator" and base == "keras.preprocessing.image":
            self._report(original, NOTES["ImageDataGenerator"] + " (tf.keras.preprocessing.image.ImageDataGenerator)")
        elif attr in MANUAL_NAMES and base.split(".")[0] in {"tf", "tensorflow", "keras"} | self.scan.backends:
            self._report(original, f"{full}: {MANUAL_NAMES[attr]}")
        else:
            self._check_module(original, full)
        return updated

    def _is_optimizer(self, node: cst.BaseExpression) -> bool:
        name = dotted(node)
        return name is not None and (name.rpartition(".")[2] == "optimizer" or name in self.scan.optimizers)

    # --- calls ---------------------------------------------------------------------------------------
    def leave_Call(self, original: cst.Call, updated: cst.Call) -> cst.BaseExpression:
        name = _callee(updated)
        func = dotted(updated.func) or ""
        args = [a for a in updated.args if _keyword(a) != "experimental_run_tf_function"]
        if name in GENERATOR_METHODS and isinstance(updated.func, cst.Attribute):
            return self._generator_call(original, updated, args)
        if name in ("fit", "evaluate", "predict") and isinstance(updated.func, cst.Attribute):
            args = self._drop_queue_args(original, args)
        if self.scan.keras_optimizer(original):
            args = [a.with_changes(keyword=cst.Name("learning_rate")) if _keyword(a) == "lr" else a for a in args]
            if any(_keyword(a) == "decay" for a in args):
                self._report(original, f"{name}(decay=...): Keras 3 optimizers have no decay; pass "
                             "learning_rate=keras.optimizers.schedules.InverseTimeDecay(lr, decay_steps=1, "
                             "decay_rate=decay) (same formula), unless a callback sets the learning rate")
        if name == "set_value" and _is_backend(func.rpartition(".")[0], self.scan.backends) and len(args) == 2:
            variable, value = args[0].value, args[1].value
            return cst.Call(cst.Attribute(variable, cst.Name("assign")), [cst.Arg(value)])
        if name == "get_value" and _is_backend(func.rpartition(".")[0], self.scan.backends) and len(args) == 1:
            self.needs_keras = True
            return cst.Call(_name_node("keras.ops.convert_to_numpy"), [args[0].with_changes(comma=cst.MaybeSentinel.DEFAULT)])
        return _with_args(updated, args)

    def _generator_call(self, original: cst.Call, updated: cst.Call, args: list[cst.Arg]) -> cst.Call:
        method, params = GENERATOR_METHODS[_callee(updated)]
        named = []
        for i, arg in enumerate(args):
            if arg.keyword is None and not arg.star and 0 < i < len(params):
                arg = arg.with_changes(keyword=cst.Name(params[i]), equal=cst.AssignEqual(
                    whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
            named.append(arg)
        named = self._drop_queue_args(original, named)
        if method != "fit" and _kwarg(named, "verbose") is None:  # Keras 2 evaluate/predict_generator were quiet
            named.append(cst.Arg(cst.Integer("0"), keyword=cst.Name("verbose"), equal=cst.AssignEqual(
                whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace(""))))
            if len(named) > 1:
                named[-2] = named[-2].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        func = updated.func.with_changes(attr=cst.Name(method))  # type: ignore[union-attr]
        return _with_args(updated.with_changes(func=func), named)

    def _drop_queue_args(self, original: cst.Call, args: list[cst.Arg]) -> list[cst.Arg]:
        dropped = [a for a in args if _keyword(a) in QUEUE_ARGS]
        if any(not _is_default_queue_arg(a) for a in dropped):
            self._report(original, "workers/use_multiprocessing/max_queue_size were dropped (Keras 3's fit/evaluate/"
                         "predict lack them): to keep parallel loading, pass them to your keras.utils.PyDataset's "
                         "constructor (super().__init__(workers=..., use_multiprocessing=...))", manual=False)
        return [a for a in args if a not in dropped]

    # --- model and weights paths ----------------------------------------------------------------------------
    def leave_SimpleString(self, original: cst.SimpleString, updated: cst.SimpleString) -> cst.SimpleString:
        return self._path_string(original, updated)  # type: ignore[return-value]

    def leave_FormattedStringText(
        self, original: cst.FormattedStringText, updated: cst.FormattedStringText
    ) -> cst.FormattedStringText:
        return self._path_string(original, updated)  # type: ignore[return-value]

    def _path_string(self, original: cst.CSTNode, updated: cst.CSTNode) -> cst.CSTNode:
        path = f"'{_string_text(original)}'"
        if original in self.paths.reports:
            key, calls = self.paths.reports[original]
            lines = ", ".join(str(line) for line in sorted({self._line(call) for call in calls}))
            self._report(original, PATH_NOTES[key].format(path=path, lines=lines), manual=key != "keras load")
        if original not in self.paths.rewrites:
            return updated
        kind = self.paths.rewrites[original]
        if option := self.paths.options.get(original):
            why = ("saves a .h5 model as legacy HDF5, which it cannot resume training from" if kind == "model"
                   else "saves weights only to .weights.h5 paths")  # fmt: skip
            self._report(original, PATH_NOTES["option"].format(option=option, suffix=NEW_SUFFIX[kind], why=why), False)
        return _with_suffix(updated, NEW_SUFFIX[kind])

    # --- TF 1 session config: statements ---------------------------------------------------------------
    def leave_SimpleStatementLine(
        self, original: cst.SimpleStatementLine, updated: cst.SimpleStatementLine
    ) -> cst.BaseStatement | cst.FlattenSentinel[cst.BaseStatement]:
        found = self.scan.config_statements.get(original)
        if found is None or (found.kind != "inline" and found.config not in self.configs):
            return updated
        pos = self.get_metadata(PositionProvider, original)
        self._rewritten_lines.update(range(pos.start.line, pos.end.line + 1))
        tf = self.configs.get(found.config, found.tf)
        value = _code(found.value) if found.value is not None else ""
        code = "".join(_setting(field, setting, tf) for field, setting in found.settings)
        if found.kind == "create" and found.config in self.scan.gpu_configs:
            code = f'{self.gpus} = {tf}.config.list_physical_devices("GPU")\n' + code
        elif found.kind in ("create", "inline"):
            pass
        elif found.kind == "growth":
            code = f"for {self.gpu} in {self.gpus}:\n    {tf}.config.experimental.set_memory_growth({self.gpu}, {value})\n"
        elif found.kind == "visible":
            devices = (
                f"{self.gpus}[{_code(found.value.args[0].value)}]"  # type: ignore[union-attr]
                if _is_str_call(found.value)
                else f'[{self.gpus}[int(i)] for i in {value}.split(",")]'
            )
            code = f'if {self.gpus}:\n    {tf}.config.set_visible_devices({devices}, "GPU")\n'
        elif found.kind == "call":
            code = _setting(found.field, found.value, tf)  # type: ignore[arg-type]
        if not code:  # apply (the settings are global in TF 2) or a config with nothing to set
            self._drop.add(id(updated))
            return updated
        statements = list(cst.parse_module(code).body)
        statements[0] = statements[0].with_changes(leading_lines=updated.leading_lines)
        if isinstance(statements[0], cst.SimpleStatementLine):
            statements[0] = statements[0].with_changes(trailing_whitespace=updated.trailing_whitespace)
        return cst.FlattenSentinel(statements) if len(statements) > 1 else statements[0]

    def leave_IndentedBlock(self, original: cst.IndentedBlock, updated: cst.IndentedBlock) -> cst.IndentedBlock:
        body = self._dropped(updated.body)
        return updated.with_changes(body=body or [cst.SimpleStatementLine([cst.Pass()])])

    def leave_Module(self, original: cst.Module, updated: cst.Module) -> cst.Module:
        return updated.with_changes(body=self._dropped(updated.body))

    def _dropped(self, body: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
        """``body`` without the dropped statements; their comment lines move to the next statement."""
        kept: list[cst.BaseStatement] = []
        carried: list[cst.EmptyLine] = []
        for statement in body:
            if id(statement) in self._drop:
                carried += statement.leading_lines  # type: ignore[attr-defined]
                continue
            if carried:
                statement = statement.with_changes(leading_lines=[*carried, *statement.leading_lines])  # type: ignore[attr-defined]
                carried = []
            kept.append(statement)
        return kept


def _keyword(arg: cst.Arg) -> str | None:
    return arg.keyword.value if arg.keyword else None


def _kwarg(args: Sequence[cst.Arg], name: str) -> cst.BaseExpression | None:
    return next((a.value for a in args if _keyword(a) == name), None)


def _is_true(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "True"


def _is_false(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Name) and node.value == "False"


def _is_str_call(node: cst.BaseExpression | None) -> bool:
    return isinstance(node, cst.Call) and _callee(node) == "str" and len(node.args) == 1 and node.args[0].keyword is None


def _is_default_queue_arg(arg: cst.Arg) -> bool:
    """``workers=1`` / ``use_multiprocessing=False``: dropping them changes nothing."""
    value = _code(arg.value)
    return (_keyword(arg), value) in {("workers", "1"), ("use_multiprocessing", "False")} or _keyword(arg) == "max_queue_size"


def _with_args(call: cst.Call, args: list[cst.Arg]) -> cst.Call:
    """``call`` with ``args``; if its last argument went, the new last one takes its (lack of a) trailing comma,
    keeping a comment that followed its own comma."""
    if args and call.args and args[-1] is not call.args[-1]:
        last = args[-1]
        after = last.comma.whitespace_after if isinstance(last.comma, cst.Comma) else None
        if isinstance(after, cst.ParenthesizedWhitespace) and _code(after).lstrip().startswith("#"):
            last = last.with_changes(whitespace_after_arg=after)
        args[-1] = last.with_changes(comma=call.args[-1].comma)
    return call.with_changes(args=args)
