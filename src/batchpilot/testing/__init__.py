"""The test kit: what tests, benchmarks and `batchpilot demo` use to drive a server, never the server itself.

- `processes`: free loopback ports, servers as child processes, readiness polling, JSON GETs.
- `requests`: prebuilt v2 requests for the demo models (binary tensor extension, perf_analyzer data).
- `loadgen`: a closed-loop HTTP/1.1 load generator.
- `queue_sim`: a deterministic discrete-event simulation of a batcher, for the autotuner's tests.
- `perfa`: running NVIDIA perf_analyzer and reading its CSV report.
"""
