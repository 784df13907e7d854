"""TensorFlow Serving's API contract, with neither TensorFlow nor a server: REST paths and JSON, the types REST and
gRPC share, Classify and Regress, the ports and default addresses."""
