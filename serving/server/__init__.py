"""``hvdk8s serve``: the TensorFlow Serving-compatible server. The REST app and ``serve`` (``app``), the gRPC
services (``grpc_server``), what both share (``core``), the models and their versions (``registry``,
``repository``), batching, Prometheus metrics, TF Serving's config files (``textproto``), worker processes and a
server run as a child process (``process``)."""
