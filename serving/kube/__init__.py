"""Serving on Kubernetes: TensorFlow Serving and KServe manifests for an exported model, their options, and the
``hvdk8s serving-manifests`` command. Needs neither TensorFlow nor the web server."""
