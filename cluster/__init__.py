"""Jobs on a Kubernetes cluster: ``hvdk8s submit``, ``status``, ``logs`` and ``delete`` for MPI Operator MPIJobs
and Kubeflow Trainer TrainJobs, through the official ``kubernetes`` client.

``client`` connects, ``kube`` creates, reads and deletes jobs, ``watch`` follows them (and explains why one
does not start, from ``jobstatus``), ``kubeerrors`` turns the API server's answers into actionable lines.
"""
