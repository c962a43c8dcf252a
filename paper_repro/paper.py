"""The paper's published numbers ("Fearless Concurrency on the GPU", cuTile Rust), as quoted
in the project's benchmark issue, for the ratios in REPORT.md."""

from __future__ import annotations

#: Element-wise add: 7.02 TB/s of a 7.67 TB/s copy ceiling on a B200.
ELEMENTWISE_TBPS = 7.02
ELEMENTWISE_COPY_TBPS = 7.67
ELEMENTWISE_FRACTION = 0.915
ELEMENTWISE_GPU = "B200"
#: GEMM at M=N=K=8192: 96.4 % of cuBLAS.
GEMM_FRACTION_OF_CUBLAS = 0.964
#: Launch overhead per op in microseconds on an RTX 5090.
LAUNCH_US = {"sync": 7.3, "chained": 3.4, "async": 3.4, "graph": 0.8}
LAUNCH_GPU = "RTX 5090"
#: cuTile Python's permute with a swapped store index: 17-35 % of elements differ between runs.
RACE_DIFFERING = (0.17, 0.35)
#: Grout (the paper's Qwen3 engine on cuTile Rust), batch-1 greedy decode: (model, GPU,
#: tokens/s, fraction of the HBM roofline or None where the paper gives none).
GROUT_DECODE = [
    ("Qwen3-4B", "RTX 5090", 171.0, 0.768),
    ("Qwen3-32B", "B200", 82.0, None),
]
