"""``hvdk8s.elastic.run`` on one rank, given a failure to raise once after an uncommitted change.

A failed collective must reset to the last commit and run the function again;
the script's own error must end the job. Prints what the second run started from.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the recorded errors

import hvdk8s

hvdk8s.init()

import keras  # noqa: E402

from collective_errors import GLOO_RESET, raised, recorded  # noqa: E402

FAILURES = {
    "gloo-reset": lambda: raised(*recorded("graph_allreduce_peer_killed", GLOO_RESET)),
    "gloo-timeout": lambda: raised(*recorded("eager_broadcast_in_commit_gloo_timeout")),
    "script-bug": lambda: ValueError("bad record 17"),
}


def main() -> None:
    failure = FAILURES[sys.argv[1]]
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, kernel_initializer="ones")])
    model.compile("sgd", "mse")
    state = hvdk8s.elastic.KerasState(model, epoch=0)
    starts: list[dict] = []

    @hvdk8s.elastic.run
    def train(state: hvdk8s.elastic.KerasState) -> None:
        starts.append({"epoch": state.epoch, "kernel": model.layers[0].kernel.numpy().ravel().tolist()})
        if len(starts) == 1:
            model.layers[0].kernel.assign([[2.0], [2.0]])
            state.epoch = 1
            state.commit()
            model.layers[0].kernel.assign([[3.0], [3.0]])  # uncommitted: lost with the failure
            state.epoch = 2
            raise failure()

    train(state)
    print("starts", json.dumps(starts), flush=True)


if __name__ == "__main__":
    main()
