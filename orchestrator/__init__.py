"""hetspec orchestrator: draft -> verify -> accept across heterogeneous devices.

Rooms, lowest first; each imports only rooms below it (tests/test_layout.py holds it to that):

    errors, config   typed configuration, pure data
    tracing          spans on device tracks (the engine records, profiling and metrics read)
    models           checkpoints, the torch transformer, the target runner and its paged KV pool,
                     tokenizers, the ONNX drafter export
    profiles         YAML placement profiles -> EngineConfig (schema, placement, check)
    engine           the step loop: schedule -> propose -> verify -> commit -> emit
    drafters         one module per local drafter kind, and their registry
    server           gRPC services, the engine loop, the remote drafter; all protobuf lives here
    assemble         EngineConfig -> running parts, for the CLI, the servers and profiling runs
    latency          cross-device latency profiling runs: reports, plots, traces
    cli              `hetspec`, one module per verb

Beside them: `devices` (cpu / cuda / npu backends, ONNX Runtime providers) and `protocol` (the
block-descriptor protocol: how tensors travel between devices, processes and hosts).
"""

__version__ = "0.1.0"
