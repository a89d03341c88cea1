"""kbit.save / kbit.load: round trips, and refusal of corrupted or mismatched files."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import kbit
from kbit import KbitFormatError

from conftest import GPU, random_weight


def _model(rng):
    return {
        "up": kbit.quantize(random_weight(48, 100, gen=rng), k=3),
        "down": kbit.repack(kbit.quantize(random_weight(20, 64, gen=rng), k=5, absmax_format="fp16")),
        "big": kbit.quantize(random_weight(4, 64, gen=rng) * 1e4, k=4),  # absmax_exponent > 0
        "norm": torch.randn(48, generator=rng).to(torch.bfloat16),
        "ids": torch.arange(7, dtype=torch.int64),
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    a, b = kbit.unrepack(a), kbit.unrepack(b)
    return (a.shape, a.k, a.absmax_exponent, a.layout) == (b.shape, b.k, b.absmax_exponent, b.layout) and all(
        torch.equal(getattr(a, p).cpu(), getattr(b, p).cpu()) for p in ("packed", "absmax", "codebook")
    )


def test_roundtrip(tmp_path, rng):
    model = _model(rng)
    assert model["big"].absmax_exponent > 0
    path = tmp_path / "m.safetensors"
    kbit.save(path, model)
    loaded = kbit.load(path)
    assert set(loaded) == set(model)
    for name in model:
        assert _same(model[name], loaded[name]), name
    assert loaded["down"].layout == "flat"  # saved in the canonical layout
    with safe_open(str(path), "pt") as f:
        meta = json.loads(f.metadata()["kbit.index"])
        assert f.metadata()["kbit.format_version"] == "1"
    assert meta["up"]["k"] == 3 and meta["up"]["N"] == 48 and meta["up"]["K"] == 100
    assert meta["up"]["block_size"] == 32 and meta["down"]["absmax_format"] == "fp16"
    assert meta["up"]["codebook"] == kbit.nf_codebook(3).tolist()


@pytest.mark.skipif(not GPU, reason="needs a CUDA GPU")
def test_load_to_device(tmp_path, rng):
    path = tmp_path / "m.safetensors"
    model = _model(rng)
    kbit.save(path, {n: v.cuda() if isinstance(v, torch.Tensor) else v.cuda() for n, v in model.items()})
    loaded = kbit.load(path, device="cuda")
    assert all(v.device.type == "cuda" for v in loaded.values())
    assert all(_same(model[n], loaded[n]) for n in model)


def _rewrite(path, out, edit_tensors=None, edit_index=None, metadata=None):
    with safe_open(str(path), "pt") as f:
        meta = dict(f.metadata())
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    index = json.loads(meta["kbit.index"])
    if edit_tensors:
        edit_tensors(tensors)
    if edit_index:
        edit_index(index)
    meta["kbit.index"] = json.dumps(index)
    save_file(tensors, str(out), metadata=metadata if metadata is not None else meta)


def _flip_byte(t):
    b = t.view(torch.uint8).reshape(-1)
    b[b.numel() // 2] ^= 0x10


@pytest.mark.parametrize(
    "edit, match",
    [
        (dict(edit_tensors=lambda t: _flip_byte(t["up.packed"])), "CRC"),
        (dict(edit_tensors=lambda t: _flip_byte(t["norm"])), "CRC"),
        (dict(edit_tensors=lambda t: t.pop("up.absmax")), "missing"),
        (dict(edit_tensors=lambda t: t.update(extra=torch.zeros(2))), "not described"),
        (dict(edit_index=lambda i: i["up"].update(K=200)), "packed has shape"),
        (dict(edit_index=lambda i: i["up"].update(k=4)), "codebook|packed has shape"),
        (dict(edit_index=lambda i: i["up"].update(block_size=64)), "block size"),
        (dict(edit_index=lambda i: i["up"].update(absmax_format="fp16")), "absmax is"),
        (dict(edit_index=lambda i: i["up"]["codebook"].__setitem__(0, -0.5)), "codebook"),
        (dict(edit_index=lambda i: i["norm"].update(shape=[8, 6])), "metadata says"),
        (dict(edit_index=lambda i: i["up"].pop("N")), "malformed"),
        (dict(edit_index=lambda i: i.update(x={"type": "mystery"})), "unknown entry type"),
        (dict(metadata={}), "no kbit metadata"),
        (dict(metadata={"kbit.format_version": "99", "kbit.index": "{}"}), "format version"),
        (dict(metadata={"kbit.format_version": "1", "kbit.index": "{not json"}), "corrupted kbit.index"),
    ],
)
def test_load_refuses_mismatched_files(tmp_path, rng, edit, match):
    path, bad = tmp_path / "m.safetensors", tmp_path / "bad.safetensors"
    kbit.save(path, _model(rng))
    _rewrite(path, bad, **edit)
    with pytest.raises(KbitFormatError, match=match):
        kbit.load(bad)


@pytest.mark.parametrize("cut", [1, 8, 100, -1, -100])
def test_load_refuses_truncated_or_garbage(tmp_path, rng, cut):
    path, bad = tmp_path / "m.safetensors", tmp_path / "bad.safetensors"
    kbit.save(path, _model(rng))
    data = path.read_bytes()
    bad.write_bytes(data[:cut] if cut > 0 else data[:cut])
    with pytest.raises(KbitFormatError):
        kbit.load(bad)
    bad.write_bytes(data[:8] + b"\x00" * 64 + data[72:])  # garbage header
    with pytest.raises(KbitFormatError):
        kbit.load(bad)


def test_save_rejects_bad_input(tmp_path, rng):
    with pytest.raises(TypeError):
        kbit.save(tmp_path / "x", [torch.zeros(1)])
    with pytest.raises(TypeError, match="expected QuantizedWeight or Tensor"):
        kbit.save(tmp_path / "x", {"a": 3})
    q = kbit.quantize(random_weight(4, 32, gen=rng), k=2)
    with pytest.raises(ValueError, match="two entries"):
        kbit.save(tmp_path / "x", {"a": q, "a.packed": torch.zeros(1)})
    with pytest.raises(FileNotFoundError):
        kbit.load(tmp_path / "does-not-exist.safetensors")
