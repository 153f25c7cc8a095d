"""Benchmarks of gqa_spec: a handful of entry points, each answering one question (README.md), run
from the repository root as `python -m benchmarks.NAME` (decode, speculative, adaptive, train_step,
device_check). Each writes OUT.json and OUT.md where `--out` says, by default under
`runs/benchmarks/`. `common` holds what they share, `workloads` the models and inputs they measure;
benchmarks import only these two and the library, never each other."""
