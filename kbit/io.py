"""kbit.save / kbit.load: QuantizedWeights and plain tensors in one safetensors file.

File layout (docs/format.md, "Serialized form"): a QuantizedWeight `name` is stored, always in
the flat layout, as three tensors `name.packed`, `name.absmax`, `name.codebook`; a plain tensor
as `name`. The safetensors metadata holds `kbit.format_version` and `kbit.index`, a JSON object
describing every entry (k, N, K, block size, absmax format and exponent, codebook, dtypes,
shapes) and a CRC-32 of every stored tensor's bytes. `load` checks all of it and refuses a
file that does not match with KbitFormatError: never a crash, never garbage.
"""

from __future__ import annotations

import json
import os
import zlib

import torch

from .format import (
    ABSMAX_DTYPES,
    BLOCK_SIZE,
    FORMAT_VERSION,
    KbitFormatError,
    QuantizedWeight,
    check_codebook,
)

_PARTS = ("packed", "absmax", "codebook")
_DTYPE_NAMES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32,
        torch.int16, torch.int8, torch.uint8, torch.bool,
    )
}


def _crc32(t: torch.Tensor) -> int:
    data = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return zlib.crc32(data)


def _dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPE_NAMES:
        raise TypeError(f"kbit.save: tensors of dtype {t.dtype} are not supported")
    return name


def save(path: str | os.PathLike, tensors: dict) -> None:
    """Save a dict of name -> QuantizedWeight (any layout; stored flat) or plain tensor."""
    from safetensors.torch import save_file

    from .api import unrepack

    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> QuantizedWeight or Tensor, got {type(tensors).__name__}")
    stored: dict[str, torch.Tensor] = {}
    index: dict[str, dict] = {}

    def put(key: str, t: torch.Tensor) -> int:
        if key in stored:
            raise ValueError(f"kbit.save: two entries both store a tensor named {key!r}")
        stored[key] = t.detach().to("cpu").contiguous()
        return _crc32(stored[key])

    for name, value in tensors.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"kbit.save: names must be non-empty strings, got {name!r}")
        if isinstance(value, QuantizedWeight):
            q = unrepack(value)
            n, kdim = q.shape
            index[name] = {
                "type": "quantized",
                "k": q.k,
                "N": n,
                "K": kdim,
                "block_size": BLOCK_SIZE,
                "absmax_format": q.absmax_format,
                "absmax_exponent": q.absmax_exponent,
                "codebook": [float(v) for v in q.codebook.cpu().tolist()],
                "crc32": {part: put(f"{name}.{part}", getattr(q, part)) for part in _PARTS},
            }
        elif isinstance(value, torch.Tensor):
            index[name] = {
                "type": "tensor",
                "dtype": _dtype_name(value),
                "shape": list(value.shape),
                "crc32": put(name, value),
            }
        else:
            raise TypeError(f"kbit.save: {name!r} is a {type(value).__name__}; expected QuantizedWeight or Tensor")
    metadata = {"kbit.format_version": str(FORMAT_VERSION), "kbit.index": json.dumps(index)}
    save_file(stored, os.fspath(path), metadata=metadata)


def _fail(path, msg: str) -> KbitFormatError:
    return KbitFormatError(f"kbit.load: {os.fspath(path)}: {msg}")


def _read(path) -> tuple[dict, dict[str, torch.Tensor]]:
    from safetensors import safe_open

    try:
        with safe_open(os.fspath(path), framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
            tensors = {key: f.get_tensor(key) for key in f.keys()}
    except FileNotFoundError:
        raise
    except Exception as e:  # safetensors raises its own error types for bad headers/truncation
        raise _fail(path, f"not a readable safetensors file (corrupted or truncated?): {e}") from None
    return metadata, tensors


def load(path: str | os.PathLike, device=None) -> dict:
    """Load what `save` wrote: a dict of name -> QuantizedWeight (flat) or Tensor, on `device`
    (default CPU). Every size, dtype, checksum and the metadata are checked."""
    metadata, tensors = _read(path)
    version = metadata.get("kbit.format_version")
    if version is None:
        raise _fail(path, "no kbit metadata (not written by kbit.save)")
    if version != str(FORMAT_VERSION):
        raise _fail(path, f"format version {version!r}; this kbit reads version {FORMAT_VERSION}")
    try:
        index = json.loads(metadata.get("kbit.index", ""))
        if not isinstance(index, dict):
            raise ValueError("not an object")
    except ValueError as e:
        raise _fail(path, f"corrupted kbit.index metadata: {e}") from None

    expected_keys: set[str] = set()
    out: dict = {}
    for name, entry in index.items():
        try:
            out[name] = _load_entry(name, entry, tensors, expected_keys)
        except KbitFormatError as e:
            raise _fail(path, f"entry {name!r}: {e}") from None
        except (KeyError, TypeError, ValueError) as e:
            raise _fail(path, f"entry {name!r}: malformed metadata ({type(e).__name__}: {e})") from None
    extra = set(tensors) - expected_keys
    if extra:
        raise _fail(path, f"tensors not described by the metadata: {sorted(extra)}")
    if device is not None:
        out = {name: v.to(device) for name, v in out.items()}
    return out


def _tensor(tensors, key, expected_keys, crc) -> torch.Tensor:
    if key not in tensors:
        raise KbitFormatError(f"tensor {key!r} is missing")
    expected_keys.add(key)
    t = tensors[key]
    if _crc32(t) != crc:
        raise KbitFormatError(f"tensor {key!r} fails its CRC-32 check (corrupted data)")
    return t


def _load_entry(name: str, entry: dict, tensors, expected_keys) -> QuantizedWeight | torch.Tensor:
    kind = entry["type"]
    if kind == "tensor":
        t = _tensor(tensors, name, expected_keys, int(entry["crc32"]))
        dtype = _DTYPE_NAMES.get(entry["dtype"])
        if t.dtype != dtype or list(t.shape) != list(entry["shape"]):
            raise KbitFormatError(
                f"stored {t.dtype} {list(t.shape)}, metadata says {entry['dtype']} {entry['shape']}"
            )
        return t
    if kind != "quantized":
        raise KbitFormatError(f"unknown entry type {kind!r}")
    if int(entry["block_size"]) != BLOCK_SIZE:
        raise KbitFormatError(f"block size {entry['block_size']}; kbit supports {BLOCK_SIZE}")
    k, n, kdim = int(entry["k"]), int(entry["N"]), int(entry["K"])
    fmt = entry["absmax_format"]
    if fmt not in ABSMAX_DTYPES:
        raise KbitFormatError(f"unknown absmax format {fmt!r}")
    crc = entry["crc32"]
    parts = {part: _tensor(tensors, f"{name}.{part}", expected_keys, int(crc[part])) for part in _PARTS}
    meta_cb = torch.tensor(entry["codebook"], dtype=torch.float64)
    check_codebook(meta_cb.to(torch.float32), k)
    if not torch.equal(parts["codebook"].to(torch.float64), meta_cb):
        raise KbitFormatError("stored codebook differs from the metadata codebook")
    if parts["absmax"].dtype != ABSMAX_DTYPES[fmt]:
        raise KbitFormatError(f"absmax is {parts['absmax'].dtype}, metadata says {fmt}")
    q = QuantizedWeight(
        parts["packed"], parts["absmax"], parts["codebook"], k, (n, kdim), int(entry["absmax_exponent"])
    )
    if fmt != "e4m4":
        a = parts["absmax"].float()
        if not (torch.isfinite(a).all() and (a >= 0).all()):
            raise KbitFormatError("absmax has negative or non-finite values")
    return q
