"""TensorFlow Serving's own tests against ``hvdk8s serve`` (../shared/peer/tfserving, issues #26 and #37).

The peer harness runs upstream's ``tensorflow_model_server_test.py`` unchanged: upstream's own ``RunServer``
starts, where bazel puts ``tensorflow_model_server``, a script that runs ``hvdk8s serve`` with the same command
line, so a TF Serving flag ``hvdk8s serve`` lacks is a failing test. The C++ REST handler test's requests go to
a server started from the fixture's model config (specific version 123, label ``Version_Label`` -> 123).
Every applicable test passes; N/A is only what no server can change.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, SHARED, needs_shared, output_of

PEER = SHARED / "peer" / "tfserving"
# The harness's N/A, each with a fragment of its reason: TF Lite models (hvdk8s serve serves SavedModels), a model
# absent from the snapshot, a C++ constant no request can reach.
NOT_APPLICABLE = {
    "testPredictOnTfLite": "TF Lite model",
    "testPredictWithSignatureDefOnTfLite": "TF Lite model",
    "test_tf_text": "absent from the fetched snapshot",
    "test_kPathRegex": "C++ constant",
}

pytestmark = [pytest.mark.e2e, needs_shared("peer/tfserving")]


def test_tf_servings_own_tests_pass_with_upstreams_run_server(tmp_path: Path) -> None:
    result = tmp_path / "result.json"
    # its own session: a hung run is killed with the servers upstream's RunServer keeps (one per command line)
    job = subprocess.Popen([str(PEER / "run.sh"), "--json", str(result)], cwd=REPO, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    output = "".join(output_of(job, total=3600, silence=900))  # a line per test; a loaded machine is slow
    assert result.is_file(), output[-8000:]
    doc = json.loads(result.read_text())
    counts, rows = doc["counts"], doc["rows"]
    failed = [row for row in rows if row[1] in ("FAIL", "ERROR")]
    assert not failed and job.returncode == 0, (failed, output[-4000:])
    not_applicable = {name.split(".")[-1]: why for name, verdict, why in rows if verdict == "N/A"}
    assert not_applicable.keys() == NOT_APPLICABLE.keys(), not_applicable
    assert all(NOT_APPLICABLE[name] in why for name, why in not_applicable.items()), not_applicable
    assert not [row for row in rows if "N/A within" in row[2]], rows  # no assertion skipped inside a passing test
    assert counts["pass"] >= 36, counts
