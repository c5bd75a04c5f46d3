"""Load tests: scenarios, the load generator, the report, capacity and cost (docs/loadtests.md)."""
