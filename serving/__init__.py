"""Serving: TensorFlow Serving export, model selection, a local REST + gRPC server, clients, load tests.

    from hvdk8s import serving
    serving.export(model, "models/digits", class_names=[str(i) for i in range(10)])
    serving.select("candidates/", "models/digits")       # best candidate -> next version
    serving.serve("models/digits", port=8501)            # TF Serving's REST (and gRPC, 8500) APIs, blocks
    serving.predict("http://127.0.0.1:8501", [png_bytes], model="digits")
    hvdk8s.serving.clients.loadtest.run("http://127.0.0.1:8501", "digits", concurrency=8, requests=1000).to_dict()

Names load on first use, so importing this package (as the manifest
commands do) pulls in neither TensorFlow nor the web server; they are
written once, as imports, in ``__init__.pyi``, which editors follow and
``lazy_loader`` loads from.
"""
import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
