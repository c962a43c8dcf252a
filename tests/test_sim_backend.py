"""The `sim` backend: default choice without a GPU, allocations registered with the
simulator's memory (and dropped with their buffers), kernel loading and its errors."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import cutile_py as ct
from cutile_py.runtime.backend import ParamValue, RuntimeFailure
from cutile_py.runtime.cuda_driver import driver_available
from cutile_py.runtime.select import default_backend_name, get_backend
from cutile_py.runtime.sim_backend import SimBackend
from tests.support.sim_harness import SAXPY


def test_sim_is_the_default_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUTILE_PY_BACKEND", raising=False)
    assert default_backend_name() == ("cuda" if driver_available() else "sim")
    monkeypatch.setenv("CUTILE_PY_BACKEND", "interpret")
    assert default_backend_name() == "interpret"  # still selectable


def test_allocations_are_registered_while_alive() -> None:
    sim = SimBackend()
    before = len(sim.memory)
    buf = sim.alloc(1000)
    assert len(sim.memory) == before + 1
    assert sim.memory.allocation(buf.address).data.size == 1000
    sim.upload(buf, np.arange(250, dtype=np.float32))
    np.testing.assert_array_equal(sim.download(buf, 1000).view(np.float32), np.arange(250))
    del buf
    gc.collect()
    assert len(sim.memory) == before


def test_tensors_on_sim_and_to_numpy() -> None:
    ct.set_backend("sim")
    t = ct.from_numpy(np.arange(10, dtype=np.int32))
    assert t.device == "sim" and ct.backend() == "sim"
    np.testing.assert_array_equal(t.to_numpy(), np.arange(10))


def test_kernels_are_parsed_once_per_text() -> None:
    sim = SimBackend()
    k1 = sim.load_kernel(SAXPY, "saxpy")
    assert sim.load_kernel(SAXPY, "saxpy") is k1
    assert len(sim._modules) == 1


def test_load_errors_name_the_ptx_line() -> None:
    sim = SimBackend()
    with pytest.raises(RuntimeFailure, match="cannot parse the PTX: PTX line 4"):
        sim.load_kernel(SAXPY.replace(".address_size 64", ".address_size 64\n@@"), "saxpy")
    bad = SAXPY.replace("fma.rn.f32", "fma.rz.sat.bogus.f32").replace("setp.ge.u32", "zork.u32")
    with pytest.raises(RuntimeFailure, match=r"PTX line \d+ `zork.u32 %p1, %r4, %r5;`"):
        sim.load_kernel(bad, "saxpy")


def test_bad_launch_configuration_fails_at_launch() -> None:
    sim = SimBackend()
    k = sim.load_kernel(SAXPY, "saxpy")
    params = [ParamValue("u64", 0)] * 3 + [ParamValue("f32", 1.0), ParamValue("u32", 0)]
    with pytest.raises(RuntimeFailure, match="at most 1024 threads"):
        sim.launch(k, (1, 1, 1), (2048, 1, 1), 0, params)
    with pytest.raises(RuntimeFailure, match="declares 5 parameters"):
        sim.launch(k, (1, 1, 1), (32, 1, 1), 0, params[:3])
    # n = 0: no thread touches memory, so null pointers are fine.
    sim.launch(k, (1, 1, 1), (32, 1, 1), 0, params).wait()


def test_compiled_kernel_fault_is_a_launch_error() -> None:
    """A kernel reading past a tensor's end (a shape lie through RawKernel) faults on sim."""
    ct.set_backend("sim")
    assert isinstance(get_backend("sim"), SimBackend)
    x = ct.zeros((64,))
    op = ct.RawKernel(SAXPY, "saxpy")(x, x, x, 1.0, 65, grid=1, block=128)
    with pytest.raises(ct.LaunchError, match=r"thread \(64, 0, 0\).*out-of-bounds load"):
        op.sync()


TWO_ENTRIES = """.version 7.0
.target sm_80
.address_size 64
.global .align 4 .u32 counter = 5;
.visible .entry bump()
{
    .reg .b32 %r1;
    atom.global.add.u32 %r1, [counter], 1;
    ret;
}
.visible .entry read(.param .u64 out)
{
    .reg .b32 %r1;
    .reg .b64 %rd1;
    ld.param.u64 %rd1, [out];
    ld.global.u32 %r1, [counter];
    st.global.u32 [%rd1], %r1;
    ret;
}
"""


def test_entries_of_one_module_share_its_global_variables() -> None:
    ct.set_backend("sim")
    read = ct.RawKernel(TWO_ENTRIES, "read")
    before, after = ct.zeros((1,), ct.i32), ct.zeros((1,), ct.i32)
    read(before, grid=1, block=1).sync()
    ct.RawKernel(TWO_ENTRIES, "bump")(grid=3, block=64).sync()
    read(after, grid=1, block=1).sync()
    # The module stays loaded in the backend: the initializer shows on its first run only.
    assert before.to_numpy()[0] >= 5
    assert after.to_numpy()[0] - before.to_numpy()[0] == 3 * 64


def test_releasing_memory_does_not_wait_for_an_executing_launch() -> None:
    """A buffer collected (on the event loop's thread, say) while a launch holds the memory
    map in a worker thread is released when that launch ends, not waited for."""
    import threading

    from cutile_py.runtime.backend import HOST_EXECUTION

    # Garbage of earlier tests first: an abandoned launched op waits for its launch when
    # collected (rule 5), and would wait here for the lock this test holds.
    gc.collect()
    sim = SimBackend()
    buf = sim.alloc(1024)
    address = buf.address
    holding, finish = threading.Event(), threading.Event()

    def executing_launch() -> None:
        with HOST_EXECUTION:
            holding.set()
            finish.wait(timeout=10)  # set by this test only once the release has returned

    worker = threading.Thread(target=executing_launch)
    worker.start()
    assert holding.wait(timeout=10)
    del buf  # its last reference: finalized here, while the worker holds the map
    # Had the release waited for the lock, it would have returned only after the worker
    # gave up waiting and ended.
    returned_while_held = worker.is_alive()
    released_at_once = not sim.memory.covers(address, 1)
    finish.set()
    worker.join()
    assert returned_while_held and not released_at_once  # left to the launch
    sim.alloc(16)  # the next use of the memory map takes the release over
    assert not sim.memory.covers(address, 1)
