"""The split kernels' workspace cache (kbit/ops.py: _workspace_need, _workspace; wgmma's
stream-K, mma's split-K), against a fake native library: runs without a GPU. What it must
guarantee: calls that may run at once never share a workspace (one per (kernel, device, stream)
eager, one per CUDA-graph capture), a workspace starts zeroed (wgmma: its flags; mma: all of
it), a captured workspace is never dropped (a graph's replays keep using it), and
KBIT_STREAMK=0 / a need of 0 give no workspace at all."""

import importlib

import pytest
import torch

from kbit import _lib, ops


class FakeLib:
    """kbit_wgmma_workspace_bytes and kbit_mma_workspace_bytes answer `need`;
    kbit_stream_capture_id answers `capture`."""

    def __init__(self, need: int):
        self.need = need
        self.capture = 0
        self.asked = 0

    def kbit_wgmma_workspace_bytes(self, dev, dtype, m, kdim, n, k, fmt):
        self.asked += 1
        return self.need

    def kbit_mma_workspace_bytes(self, dev, k, m, n, kdim):
        self.asked += 1
        return self.need

    def kbit_stream_capture_id(self, stream):
        return self.capture


@pytest.fixture
def cache(monkeypatch):
    """Fresh module state for each test."""
    monkeypatch.setattr(ops, "_ws_need", {})
    monkeypatch.setattr(ops, "_workspaces", {})
    monkeypatch.setattr(ops, "_graph_workspaces", {})
    monkeypatch.setattr(ops, "_graph_kept", [])
    monkeypatch.setattr(ops, "_wgmma_shared_workspace", None)
    monkeypatch.setattr(ops, "_wgmma_streamk", True)
    return ops


X = torch.empty(1, 8, dtype=torch.float16)
NEED = ops._FLAG_BYTES + 1000


def _ws(lib, stream, m=256, kernel="wgmma"):
    """What _small_m_cuda_into does for a call on `stream`."""
    need = ops._workspace_need(lib, kernel, 0, X.dtype, m, 2048, 5120, 4, 0)
    return ops._workspace(lib, kernel, X, 0, stream, need)


def test_no_split_no_workspace(cache):
    lib = FakeLib(0)
    assert _ws(lib, 7) is None
    assert _ws(lib, 7) is None
    assert _ws(lib, 7, kernel="mma") is None
    assert lib.asked == 2  # the answer is cached per kernel and shape
    lib = FakeLib(NEED)
    cache._wgmma_streamk = False  # KBIT_STREAMK=0
    assert _ws(lib, 7) is None
    assert lib.asked == 0


def test_mma_own_workspace_zeroed(cache):
    lib = FakeLib(NEED)
    w = _ws(lib, 7)
    a = _ws(lib, 7, kernel="mma")
    assert a is not w  # wgmma leaves its partials behind; mma needs every word zero
    assert a.numel() >= NEED and not a.any()
    assert _ws(lib, 7, kernel="mma") is a
    lib.capture = 5
    g = _ws(lib, 7, kernel="mma")
    assert g is not a and not g.any()


def test_eager_one_per_stream_zeroed(cache):
    lib = FakeLib(NEED)
    a = _ws(lib, 7)
    assert a.numel() >= NEED and a.dtype == torch.uint8
    assert not a[: ops._FLAG_BYTES].any()
    assert _ws(lib, 7) is a  # calls on one stream run one after another: they share it
    b = _ws(lib, 8)
    assert b is not a and b.data_ptr() != a.data_ptr()  # another stream may run at once
    lib.need = 2 * NEED
    c = _ws(lib, 7, m=128)  # a larger need on the same stream: a larger zeroed workspace
    assert c.numel() >= 2 * NEED and not c[: ops._FLAG_BYTES].any()
    assert _ws(lib, 7, m=128) is c


def test_eager_evicts_least_recently_used(cache):
    lib = FakeLib(NEED)
    held = {s: _ws(lib, s) for s in range(8)}
    assert _ws(lib, 0) is held[0]  # stream 0 used again: now the most recent
    _ws(lib, 100)  # a ninth stream evicts the least recently used, stream 1
    assert _ws(lib, 0) is held[0]
    assert _ws(lib, 2) is held[2]
    assert len(cache._workspaces) == 8 and ("wgmma", 0, 1) not in cache._workspaces


def test_captured_workspaces_per_capture_and_kept(cache):
    lib = FakeLib(NEED)
    eager = _ws(lib, 7)
    lib.capture = 11
    g1 = _ws(lib, 7)
    assert g1 is not eager  # a graph's replays may run while eager calls do: its own workspace
    assert not g1[: ops._FLAG_BYTES].any()
    assert _ws(lib, 7) is g1  # one per capture: its calls run one after another
    lib.need = 2 * NEED
    g1b = _ws(lib, 7, m=128)  # grows within the capture: the first stays alive (kept)
    assert g1b is not g1 and g1b.numel() >= 2 * NEED
    lib.capture = 12
    g2 = _ws(lib, 7, m=128)
    assert g2 is not g1b  # another graph: its own
    lib.capture = 0
    assert _ws(lib, 7) is eager  # eager calls keep theirs
    kept = cache._graph_kept
    assert any(t is g1 for t in kept) and any(t is g1b for t in kept) and any(t is g2 for t in kept)


def test_shared_workspace_override(cache):
    lib = FakeLib(NEED)
    shared = torch.zeros(NEED, dtype=torch.uint8)
    cache.use_wgmma_workspace(shared)
    assert _ws(lib, 7) is shared
    lib.capture = 3
    assert _ws(lib, 9) is shared
    cache.use_wgmma_workspace(None)
    lib.capture = 0
    assert _ws(lib, 7) is not shared


def test_forced_split_clears_plan_caches(cache, monkeypatch):
    """A forced K split changes the workspace bytes and what mma takes: every cache of them
    (mma_supports', the workspace sizes, kbit.linear's fast path) starts again."""
    linear = importlib.import_module("kbit.linear")  # the module (kbit.linear is the function)
    monkeypatch.setattr(linear, "_supported", {("mma", 8, 2048, 5120, 4, 0, torch.float16): (True, "mma", 64)})
    monkeypatch.setattr(ops, "_max_m", {(0, 4, 5120, 2048): 64})
    assert _ws(FakeLib(NEED), 7, kernel="mma") is not None
    assert cache._ws_need
    ops.force_mma_ksplit(0)
    assert not linear._supported and not ops._max_m and not cache._ws_need


def test_forced_wgmma_config_clears_workspace_caches(cache, monkeypatch):
    """A forced wgmma configuration changes whether a call runs stream-K (its workspace bytes):
    the workspace sizes and kbit.linear's fast path, which caches them, start again."""
    linear = importlib.import_module("kbit.linear")
    monkeypatch.setattr(linear, "_supported", {("wgmma", 64, 2048, 5120, 4, 0, torch.float16): (True, "wgmma", NEED)})
    assert _ws(FakeLib(NEED), 7) is not None
    assert cache._ws_need
    monkeypatch.setattr(_lib, "available", lambda: False)  # the bookkeeping only, no library call
    ops.force_wgmma_config()
    assert not linear._supported and not cache._ws_need
