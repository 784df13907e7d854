"""hvdk8s: Horovod data-parallel training for Keras 3, on a laptop or on Kubernetes.

A Horovod Keras script ports by changing its import::

    import hvdk8s as hvd                     # was: import horovod.tensorflow.keras as hvd
    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    model.compile(optimizer=opt, loss=..., metrics=[...])
    model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                               hvd.callbacks.MetricAverageCallback()])

The top level, ``hvdk8s.callbacks`` and ``hvdk8s.elastic`` carry
``horovod.tensorflow.keras``'s names, signatures and defaults. hvdk8s's own
additions have names Horovod does not use: ``default_callbacks()`` (the
callbacks above plus checkpoints, metrics and a rank-0 progress bar),
``Checkpoint``, ``data``, ``models``, ``serving`` ...

Names are imported on first use, so ``import hvdk8s`` (and the CLI's
Kubernetes commands) do not load TensorFlow or Horovod until needed. The
names and where each comes from are written once, as imports, in
``__init__.pyi``: editors and type checkers read them there, and
``lazy_loader`` loads them from there at run time.
"""
import lazy_loader

__version__ = "0.1.0"

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
