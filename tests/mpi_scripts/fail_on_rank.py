"""Rank 1 fails with exit code 3 after saying hello; rank 0 then blocks in a collective."""
import sys
import time

import hvdk8s

hvdk8s.init()
print(f"hello from rank {hvdk8s.rank()}", flush=True)
if hvdk8s.rank() == 1:
    time.sleep(3)  # rank 0 prints its hello before this exit makes mpirun stop it
    sys.exit(3)
hvdk8s.collectives.average_scalars({"x": 1.0})
