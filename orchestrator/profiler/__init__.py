"""Cross-device latency profiling: spans, profiling runs, reports, plots, traces and metrics."""
