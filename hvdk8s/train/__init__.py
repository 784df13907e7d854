"""Training with Keras ``fit`` across ranks: ``optimizer`` (``DistributedOptimizer``, ``DistributedGradientTape``),
``fused`` (the one-kernel SGD update), ``schedule`` (the rate callbacks' in-step half: per-batch rates, momentum
correction), ``fit_step`` (``fit``'s per-step call), ``loading`` (``load_model``), ``checkpoint`` (atomic saves and
the latest checkpoint back) and ``keras_compat`` (every use of Keras behaviour its documentation does not spell out).
The public names are ``hvdk8s``'s (``hvdk8s.DistributedOptimizer``, ``hvdk8s.Checkpoint``, ...)."""
