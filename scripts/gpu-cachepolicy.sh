#!/usr/bin/env bash
# One page-cache policy on the GPU machine (docs/design/gpuio.md, docs/bench.md
# "One page-cache policy"): cold and repeated kylix load, --io direct vs auto.
# Run from the repository root after make gpu-build, carrying .gpu.
