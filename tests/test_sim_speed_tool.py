"""`python -m cutile_py.tools.sim_speed --ab TREE`: the GEMM timed in two trees' processes,
launches alternating, and the table made of those times."""

from __future__ import annotations

from cutile_py.tools.sim_speed import ROOT, ab, ab_report


def test_ab_times_each_tree_and_reports_them() -> None:
    times = ab({"one": ROOT, "two": ROOT}, launches=3)
    assert sorted(times) == ["one", "two"]
    for ts in times.values():
        assert len(ts) == 3
        assert all(0.0 < t < 10.0 for t in ts)  # one launch of a 128^3 GEMM, in seconds
    text = ab_report({"a": [0.002, 0.001, 0.003], "b": [0.004] * 3}, (1.0, 2.0))
    assert "| a | 1.00 | 1.00 | 2.00 |" in text
    assert "| b | 4.00 | 4.00 | 4.00 |" in text
    assert "3 launches each" in text and "1.0, 2.0" in text
