"""The public names of ``hvdk8s``, for editors and type checkers; ``__init__.py`` loads each on first use from here."""

__version__: str

from . import callbacks as callbacks, collectives as collectives, data as data, elastic as elastic, launcher as launcher, models as models, mpijob as mpijob, serving as serving
# Horovod's runtime (hvdk8s's init also pins devices and threads), and is_chief
from .runtime import (
    init as init,
    shutdown as shutdown,
    is_initialized as is_initialized,
    size as size,
    local_size as local_size,
    cross_size as cross_size,
    rank as rank,
    local_rank as local_rank,
    cross_rank as cross_rank,
    start_timeline as start_timeline,
    stop_timeline as stop_timeline,
    mpi_threads_supported as mpi_threads_supported,
    mpi_enabled as mpi_enabled,
    mpi_built as mpi_built,
    gloo_enabled as gloo_enabled,
    gloo_built as gloo_built,
    nccl_built as nccl_built,
    ddl_built as ddl_built,
    ccl_built as ccl_built,
    cuda_built as cuda_built,
    rocm_built as rocm_built,
    is_chief as is_chief,
)
# Horovod's collectives and objects
from .collectives import (
    Average as Average,
    Sum as Sum,
    Adasum as Adasum,
    Compression as Compression,
    ProcessSet as ProcessSet,
    global_process_set as global_process_set,
    add_process_set as add_process_set,
    remove_process_set as remove_process_set,
    allreduce as allreduce,
    allgather as allgather,
    broadcast as broadcast,
    reducescatter as reducescatter,
    broadcast_object as broadcast_object,
    allgather_object as allgather_object,
    broadcast_variables as broadcast_variables,
    broadcast_global_variables as broadcast_global_variables,
)
from .train.optimizer import (
    DistributedOptimizer as DistributedOptimizer,
    PartialDistributedOptimizer as PartialDistributedOptimizer,
    DistributedGradientTape as DistributedGradientTape,
)
from .train.loading import (
    load_model as load_model,
)
# hvdk8s's own
from .defaults import (
    default_callbacks as default_callbacks,
)
from .train.checkpoint import (
    Checkpoint as Checkpoint,
    restore_latest as restore_latest,
    save_atomic as save_atomic,
)
from .observe.observability import (
    observability_callbacks as observability_callbacks,
)
from .observe.metrics import (
    TrainingMetrics as TrainingMetrics,
)
from .observe.progress import (
    ProgressBar as ProgressBar,
)
