"""One pipeline, two executors: ingest -> train candidates -> select -> serve -> load test.

    pipeline = load_pipeline("pipeline.yaml")   # strict, every error with its field path
    graph = build(pipeline)                      # the ONE DAG both executors come from
    workflow = render_workflow(graph)            # Argo Workflow (dict)
    run_local(graph, out_dir)                    # the same steps on this machine
"""
from hvdk8s.pipeline.dag import Dag, Step, build
from hvdk8s.pipeline.load import load_pipeline
from hvdk8s.pipeline.spec import Pipeline

__all__ = ["Dag", "Pipeline", "Step", "build", "load_pipeline", "render_workflow", "rbac", "run_local"]


def render_workflow(dag: Dag) -> dict:
    """The Argo Workflow of ``dag`` (imports Hera only when called)."""
    from hvdk8s.pipeline.argo import render

    return render(dag)


def rbac(pipeline: Pipeline) -> list[dict]:
    from hvdk8s.pipeline import argo

    return argo.rbac(pipeline)


def run_local(dag: Dag, out_dir, **options):
    from hvdk8s.pipeline.local import run

    return run(dag, out_dir, **options)
