"""Watching a training job: ``metrics`` (each rank's Prometheus endpoint, the job-wide figures), ``telemetry`` (GPU
readings from NVML, at scrape time), ``progress`` (rank 0's progress bar), ``observability`` (these callbacks in the
order they must run) and ``ranklog`` (once-only, rank-aware log lines). The public names are ``hvdk8s``'s
(``hvdk8s.TrainingMetrics``, ``hvdk8s.ProgressBar``, ``hvdk8s.observability_callbacks``)."""
