"""Clients of a TensorFlow Serving-compatible server: REST (no TensorFlow needed), gRPC, and ``hvdk8s loadtest``."""
