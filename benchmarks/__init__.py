"""Benchmarks of gqa_spec: each module one measurement, run from the repository root as
`python -m benchmarks.NAME` (writes `results/benchmarks/NAME.{json,md}` unless `--out` says
otherwise). `common` holds what they share (machine and hardware limits, timing, writers, the
`--baseline` A/B protocol), `workloads` the models and inputs they measure, `op_profile` the per-op
profiles of XLA:CPU computations."""
