"""The model side of serving: exporting a Keras model as a TensorFlow Serving version, and choosing the best candidate."""
