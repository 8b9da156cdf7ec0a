"""The BatchPilot operator: reconciles BatchedModel resources into KServe InferenceServices."""

from batchpilot.operator.main import build_registry, run_operator

__all__ = ["build_registry", "run_operator"]
