"""Names of one Workflow run's objects on the cluster.

The Workflow is created with ``generateName: <pipeline>-``, so each run gets its own name:
Kubernetes appends 5 random characters (apiserver ``pkg/storage/names/generate.go``,
``SimpleNameGenerator``: ``randomLength = 5``; the base is cut to 58 characters, never
needed here since pipeline names are at most 40). Candidates' MPIJobs are named after the
run, ``<workflow name>-<candidate>``, so overlapping runs never collide and each run's exit
handler deletes only its own jobs. Argo fills in ``{{workflow.name}}`` when it runs a template.
"""
from __future__ import annotations

WORKFLOW_NAME = "{{workflow.name}}"
RANDOM_SUFFIX = 5


def generate_name(pipeline: str) -> str:
    """The Workflow's ``metadata.generateName``."""
    return f"{pipeline}-"


def longest_workflow_name(pipeline: str) -> str:
    """A run's name at its longest (every run's name has this length): what name limits are checked with."""
    return generate_name(pipeline) + "x" * RANDOM_SUFFIX


def candidate_job(workflow_name: str, candidate: str) -> str:
    """A candidate's MPIJob in the run ``workflow_name`` (``WORKFLOW_NAME`` in the rendered Workflow)."""
    return f"{workflow_name}-{candidate}"
