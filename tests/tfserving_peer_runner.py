"""Run upstream TF Serving tests with upstream's own ``RunServer``: ``tensorflow_model_server`` is ``hvdk8s serve``.

Usage: python tfserving_peer_runner.py TEST_SRCDIR RESULT_JSON TEST_NAME...

The peer harness (../shared/peer/tfserving/harness.py) substitutes
``RunServer`` and reports tests that need ``--model_config_file``,
``--monitoring_config_file``, ``--grpc_channel_arguments`` or
``--grpc_socket_path`` as N/A. Here nothing of the upstream files is
replaced: TEST_SRCDIR holds the peer's testdata and, where TF Serving's
binary would be, a script that runs ``hvdk8s serve`` with the arguments it
gets, so upstream's own command line (``--port``, ``--rest_api_port``,
``--model_name``, ``--model_base_path``, ``--grpc_socket_path``, ...) is what
``hvdk8s serve`` parses.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import unittest
from pathlib import Path

PEER = Path(__file__).resolve().parents[2] / "shared" / "peer" / "tfserving"


def main(srcdir: str, result: str, *names: str) -> int:
    os.environ["TEST_SRCDIR"] = srcdir
    from absl import flags

    flags.FLAGS(sys.argv[:1], known_only=True)
    import tensorflow_serving

    tensorflow_serving.__path__.append(str(PEER / "upstream" / "tensorflow_serving"))  # model_servers/ from upstream
    test = importlib.import_module("tensorflow_serving.model_servers.tensorflow_model_server_test")
    os.makedirs(flags.FLAGS.test_tmpdir, exist_ok=True)  # bazel makes it; the config reload tests write there
    suite = unittest.TestSuite(test.TensorflowModelServerTest(name) for name in names)
    outcome = unittest.TextTestRunner(stream=sys.stderr, verbosity=2).run(suite)
    failed = {str(t): text.strip().splitlines()[-1] for t, text in outcome.failures + outcome.errors}
    Path(result).write_text(json.dumps({"run": outcome.testsRun, "skipped": len(outcome.skipped), "failed": failed}))
    return 0 if outcome.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
