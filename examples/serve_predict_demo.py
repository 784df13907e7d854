"""Serve an exported model locally and classify held-out digit images over REST.

    python examples/serve_predict_demo.py out/models/digits --images out/digit-images

Writes held-out test digits (never seen in training) as PNG and JPEG files,
starts ``hvdk8s serve`` on a free port, runs ``hvdk8s predict`` on the files
(the same client works against TensorFlow Serving), prints each result next
to the true label, and stops the server.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np
from PIL import Image

from hvdk8s.data import load_digits

HVDK8S = [sys.executable, "-m", "hvdk8s.cli"]


def write_images(folder: Path, count: int) -> dict[Path, int]:
    """The first ``count`` test digits as PNG, alternating with JPEG; returns file -> label."""
    _, (x_test, y_test) = load_digits()
    folder.mkdir(parents=True, exist_ok=True)
    labels = {}
    for i in range(count):
        path = folder / f"digit-{i:02d}-label{y_test[i]}.{'png' if i % 2 == 0 else 'jpg'}"
        Image.fromarray(np.round(x_test[i, ..., 0] * 255).astype(np.uint8)).save(path)
        labels[path] = int(y_test[i])
    return labels


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("base_path", type=Path, help="model base path written by hvdk8s export/select")
    p.add_argument("--images", type=Path, default=Path("out/digit-images"))
    p.add_argument("--count", type=int, default=8)
    args = p.parse_args()

    labels = write_images(args.images, args.count)
    serve = [*HVDK8S, "serve", str(args.base_path), "--port", "0"]
    print("$ hvdk8s", " ".join(serve[3:]), flush=True)
    server = subprocess.Popen(serve, stdout=subprocess.PIPE, text=True)
    try:
        ready = server.stdout.readline()
        if "http://" not in ready:
            print("server did not start", file=sys.stderr)
            return 1
        print(ready.strip(), flush=True)
        url = ready[ready.index("http://") :].split("/v1/")[0]  # the base path may contain anything
        predict = [*HVDK8S, "predict", "--url", url, "--model", args.base_path.resolve().name, *map(str, labels)]
        print("$ hvdk8s", " ".join(predict[3:]), flush=True)
        run = subprocess.run(predict, capture_output=True, text=True)
        print(run.stdout, end="")
        if run.returncode != 0:
            print(run.stderr, end="", file=sys.stderr)
            return run.returncode
        predicted = [int(line.split(": class ")[1].split()[0]) for line in run.stdout.splitlines()]
        correct = sum(k == label for k, label in zip(predicted, labels.values()))
        print(f"{correct}/{len(labels)} held-out images classified correctly through the REST API")
        return 0
    finally:
        server.terminate()
        server.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
