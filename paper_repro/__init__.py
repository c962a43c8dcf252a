"""The benchmark harness that reproduces the cuTile Rust paper's measurements for cutile_py:
`python -m paper_repro all --out DIR` (see README.md)."""
