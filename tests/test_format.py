"""The format pieces: codebooks, E4M4, bit-planes, absmax exponent, the container."""

import statistics

import pytest
import torch

from kbit.format import (
    E4M4_MAX,
    KbitFormatError,
    QuantizedWeight,
    check_codebook,
    choose_absmax_exponent,
    e4m4_decode,
    e4m4_encode,
    e4m4_table,
    nf_codebook,
    pack_bitplanes,
    unpack_bitplanes,
)


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_nf_codebook_matches_definition(k):
    # independent: statistics.NormalDist in float64, scaled by max |v|, rounded to float32
    n = 2**k
    v = [statistics.NormalDist().inv_cdf((i + 0.5) / n) for i in range(n)]
    m = max(abs(x) for x in v)
    expected = torch.tensor([x / m for x in v], dtype=torch.float64).to(torch.float32)
    cb = nf_codebook(k)
    assert cb.dtype == torch.float32 and cb.shape == (n,)
    assert torch.equal(cb, expected)
    assert cb[0] == -1 and cb[-1] == 1 and (cb[1:] > cb[:-1]).all()


@pytest.mark.parametrize(
    "bad, why",
    [
        (torch.linspace(-1, 1, 8), "shape"),
        (torch.linspace(1, -1, 16), "ascending"),
        (torch.linspace(-2, 1, 16), r"\[-1, 1\]"),
        (torch.full((16,), float("nan")), "NaN"),
        (torch.arange(16), "floating"),
        (torch.cat([torch.zeros(1), torch.zeros(1), torch.linspace(0.1, 1, 14)]), "ascending"),
        (torch.cat([torch.zeros(1), torch.full((1,), 2.0**-22), torch.linspace(0.1, 1, 14)]), "apart"),
    ],
)
def test_check_codebook_rejects(bad, why):
    with pytest.raises(KbitFormatError, match=why):
        check_codebook(bad, 4)


def test_e4m4_all_codes():
    table = e4m4_table()
    for code in range(256):
        e, m = code >> 4, code & 15
        want = m / 16 * 2.0**-10 if e == 0 else (1 + m / 16) * 2.0 ** (e - 11)
        assert table[code].item() == want, code
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    assert torch.equal(e4m4_decode(codes), table)
    assert torch.equal(e4m4_encode(table), codes)  # every code round-trips
    assert table[1] == 2.0**-14 and table[255] == E4M4_MAX and (table[1:] > table[:-1]).all()


def test_e4m4_encode_nearest_ties_to_even(rng):
    table = e4m4_table().double()
    v = torch.rand(20000, generator=rng, dtype=torch.float64) * 31
    v = torch.cat([v, (10 ** (-5 * torch.rand(20000, generator=rng, dtype=torch.float64)))]).float()
    code = e4m4_encode(v).long()
    err = (table[code] - v.double()).abs()
    best = (table[None, :] - v.double()[:, None]).abs().min(1).values
    assert torch.equal(err, best)
    mids = ((table[1:] + table[:-1]) / 2).float()  # exact in float32
    mid_codes = e4m4_encode(mids).long()
    lower = torch.arange(255)
    assert torch.equal(mid_codes, torch.where(lower % 2 == 0, lower, lower + 1))
    with pytest.raises(KbitFormatError):
        e4m4_encode(torch.tensor([31.5]))


@pytest.mark.parametrize("k", [2, 3, 4, 5])
def test_bitplanes(k, rng):
    idx = torch.randint(0, 2**k, (7, 5, 32), generator=rng)
    words = pack_bitplanes(idx, k)
    assert words.dtype == torch.int32 and words.shape == (7, 5, k)
    assert torch.equal(unpack_bitplanes(words, k), idx)
    # bit i of word b is bit b of element i's index
    w = words.long() & 0xFFFFFFFF
    for b in range(k):
        for i in (0, 13, 31):
            assert torch.equal((w[..., b] >> i) & 1, (idx[..., i] >> b) & 1)


def test_absmax_exponent():
    assert choose_absmax_exponent(torch.tensor([0.0, 2.0**-14, 31.0]), "e4m4") == 0
    t = choose_absmax_exponent(torch.tensor([0.5, 1000.0]), "e4m4")
    assert 1000 * 2.0**-t <= 31 and 1000 * 2.0 ** -(t - 1) > 31
    t = choose_absmax_exponent(torch.tensor([1e-6, 1e-3]), "e4m4")
    assert t < 0 and 1e-6 * 2.0**-t >= 2.0**-14
    with pytest.raises(KbitFormatError, match="span"):
        choose_absmax_exponent(torch.tensor([1e-9, 10.0]), "e4m4")
    assert choose_absmax_exponent(torch.tensor([1e-9, 10.0]), "fp32") == 0


def test_container_validation():
    packed = torch.zeros(4, 2, 3, dtype=torch.int32)
    absmax = torch.zeros(4, 2, dtype=torch.uint8)
    cb = nf_codebook(3)
    q = QuantizedWeight(packed, absmax, cb, 3, (4, 40))
    assert q.absmax_format == "e4m4" and q.bits_per_weight == 3.25
    with pytest.raises(KbitFormatError, match="packed has shape"):
        QuantizedWeight(packed, absmax, cb, 3, (4, 80))
    with pytest.raises(KbitFormatError, match="absmax has shape"):
        QuantizedWeight(packed, absmax[:3], cb, 3, (4, 40))
    with pytest.raises(ValueError, match="k must be"):
        QuantizedWeight(packed, absmax, cb, 6, (4, 40))
    with pytest.raises(KbitFormatError, match="packed must be int32"):
        QuantizedWeight(packed.float(), absmax, cb, 3, (4, 40))
    with pytest.raises(KbitFormatError, match="absmax has dtype"):
        QuantizedWeight(packed, absmax.to(torch.int16), cb, 3, (4, 40))
    with pytest.raises(KbitFormatError, match="codebook"):
        QuantizedWeight(packed, absmax, nf_codebook(4), 3, (4, 40))
