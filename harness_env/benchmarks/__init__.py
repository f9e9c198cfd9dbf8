"""`launch.bench` suites that run harnesses or sandboxes (research/benchmarks has the rest)."""
