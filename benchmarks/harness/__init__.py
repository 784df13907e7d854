"""What each benchmark run drives, and the results it writes: the suite's local matrix (``suite``), the same matrix
as Kubernetes jobs (``cluster_jobs``, ``cluster_submit``, ``cluster_collect``), chaos runs (``chaos``), the serving
benchmark (``serving_bench``) and the per-batch callback study (``callback_cost``)."""
