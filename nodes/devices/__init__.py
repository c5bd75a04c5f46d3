"""Device validation: what a node's machine is (inventory), how fast it runs (benchmarks) and
whether that suits its package (the compatibility matrix). See docs/validation.md."""
