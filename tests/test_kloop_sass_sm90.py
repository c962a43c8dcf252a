"""`paper_repro.kloop_sass_sm90`: the sm_90a K loop of the library GEMM counted in SASS."""

from __future__ import annotations

import pytest

from cutile_py.runtime.nvjitlink import nvjitlink_available
from cutile_py.runtime.sass import SassUnavailable
from paper_repro import kloop_sass_sm90


@pytest.mark.skipif(not nvjitlink_available(), reason="the nvJitLink library cannot be loaded")
def test_wide_candidate_loop_is_wgmma_fed_by_tma_alone() -> None:
    """128 x 256 x 64: per K step 4 HGMMA (k16 each, m64n256 per warpgroup) and 5 boxes
    (A, and B's 4 panels of 128 bytes), no cp.async."""
    try:
        loop = kloop_sass_sm90.measure(128, 256, 64, 3)
    except SassUnavailable as e:
        pytest.skip(str(e))
    assert loop.counts["HGMMA"] == 4
    assert loop.counts["UTMALDG"] == 5
    assert loop.counts["LDGSTS"] == 0
    assert loop.counts["SYNCS"] >= 2  # the barrier wait and the expect_tx arrive
    assert loop.total > loop.integer > 0
    assert loop.in_flight == 1  # one wgmma group runs on while the next stage is awaited
