"""TensorFlow Serving's API contract, without the server: the types REST and gRPC share, REST paths and JSON, Classify
and Regress, TF Serving's float text, the default ports and addresses. TensorFlow is imported only inside
``classify_regress``, where ``tf.Example`` protos are built."""
