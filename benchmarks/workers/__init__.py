"""The processes the harness starts (mpirun ranks, TF_CONFIG tasks, a cluster job's pods, elastic chaos workers),
and what they train: ``worker``, ``comm_worker``, ``cluster_entry``, ``chaos_worker``, Horovod's synthetic benchmarks
(``synthetic_loop``, ``synthetic_fit``), the strategies' trainers and workloads, ``profiling``."""
