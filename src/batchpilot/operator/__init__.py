"""The BatchPilot operator: reconciles BatchedModel resources into KServe InferenceServices.

Entry points: `batchpilot.operator.main.run_operator` and `build_registry` (kopf is imported there only,
so that `batchpilot serve` never pays for it).
"""
