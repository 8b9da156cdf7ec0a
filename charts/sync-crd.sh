#!/bin/sh
# Copy the generated BatchedModel CRD into the chart's crds/ folder, byte for byte.
# Run after `python -m batchpilot.operator.crdgen`; tests/chart/test_crd.py fails while the two differ.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/charts/batchpilot/crds"
cp "$root/crds/batchpilot.io_batchedmodels.yaml" "$root/charts/batchpilot/crds/batchpilot.io_batchedmodels.yaml"
