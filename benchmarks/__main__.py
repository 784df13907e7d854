"""``python -m benchmarks`` (repository root) or ``python -m hvdk8s.benchmarks``: same as ``hvdk8s bench``."""
import sys

from .cli import main

sys.exit(main())
