"""Tests for ctxpod.hashing against what vLLM and SGLang publish.

Where upstream publishes a literal value it is copied here as a literal, with
its source. Where upstream pins only a formula (all of vLLM's block-hash tests,
most of SGLang's), the expected value is computed here by an independent
formula spelled out from the upstream source, and the comment says so. For
vLLM's "sha256_cbor" the CBOR bytes are built by hand per RFC 8949 (see
``_cbor``), so the check does not go through cbor2 the way the module does.

Sources (commits as read):
  vllm-project/vllm
    tests/v1/core/test_kv_cache_utils.py      @ 002f10e0cfa1373a19a0d2756598a34b700d20e5
    vllm/v1/core/kv_cache_utils.py            @ 002f10e0cfa1373a19a0d2756598a34b700d20e5
    tests/utils_/test_hashing.py              @ c96c471d1b439609b5822c5becfe4c22863db545
    vllm/utils/hashing.py                     @ ac621345a4eb18058bb24b242b457f634d476b40
  sgl-project/sglang
    test/registered/unit/mem_cache/test_mem_cache_utils.py
                                              @ 06ab04abc53fef1bd3b3dbdae760c2f3a18d13b8
    python/sglang/srt/utils/hashing.py        @ 4d374af2ff141166b2d28872a66851e6d9c86bf6
    python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py
                                              @ 00fe477f32b3878f64d44cc36895e1de4a113afe
"""

from __future__ import annotations

import hashlib
import pickle
import struct
import sys
from array import array

import pytest

from ctxpod import hashing

HAS_CBOR2 = True
try:
    import cbor2  # noqa: F401
except ImportError:  # pragma: no cover - depends on the environment
    HAS_CBOR2 = False

needs_cbor2 = pytest.mark.skipif(not HAS_CBOR2, reason="cbor2 is not installed")

# vLLM's two cryptographic algorithms; the xxhash ones are tested separately.
SHA_ALGOS = ["sha256", pytest.param("sha256_cbor", marks=needs_cbor2)]


# --------------------------------------------------------------------------
# independent reference formulas


def _pickle_sha256(obj) -> bytes:
    # vllm/utils/hashing.py::sha256, as pinned by
    # tests/utils_/test_hashing.py::test_sha256:
    #   hashlib.sha256(pickle.dumps(input, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _cbor_head(major: int, n: int) -> bytes:
    # RFC 8949 section 3: shortest-form argument (what canonical encoding requires).
    if n < 24:
        return bytes([(major << 5) | n])
    for extra, fmt in ((24, ">B"), (25, ">H"), (26, ">I"), (27, ">Q")):
        if n < 1 << (8 * struct.calcsize(fmt)):
            return bytes([(major << 5) | extra]) + struct.pack(fmt, n)
    raise ValueError("too large for this test encoder")


def _cbor(obj) -> bytes:
    """Hand-written RFC 8949 encoding of None / int >= 0 / bytes / str / tuple."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bool):
        raise TypeError("not needed here")
    if isinstance(obj, int):
        if obj < 0:
            raise ValueError("not needed here")
        return _cbor_head(0, obj)
    if isinstance(obj, bytes):
        return _cbor_head(2, len(obj)) + obj
    if isinstance(obj, str):
        b = obj.encode("utf-8")
        return _cbor_head(3, len(b)) + b
    if isinstance(obj, tuple):
        return _cbor_head(4, len(obj)) + b"".join(_cbor(x) for x in obj)
    raise TypeError(type(obj))


def _cbor_sha256(obj) -> bytes:
    # vllm/utils/hashing.py::sha256_cbor is
    #   hashlib.sha256(cbor2.dumps(input, canonical=True)).digest()
    # computed here from the RFC 8949 bytes instead of cbor2.
    return hashlib.sha256(_cbor(obj)).digest()


REF = {"sha256": _pickle_sha256, "sha256_cbor": _cbor_sha256}


def _legacy_get_hash_str(token_ids, prior_hash=None):
    # Copied from sgl-project/sglang test/registered/unit/mem_cache/
    # test_mem_cache_utils.py @ 06ab04ab (the per-token loop SGLang's tests
    # hold its get_hash_str equal to).
    hasher = hashlib.sha256()
    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))
    for t in token_ids:
        if isinstance(t, tuple):
            for elem in t:
                hasher.update(elem.to_bytes(4, byteorder="little", signed=False))
        else:
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))
    return hasher.hexdigest()


def _legacy_page_hashes(key, page_size, prior_hash=None):
    # Same file and commit; note it also hashes a short last chunk, which
    # ctxpod (like SGLang's page-aligned storage path) leaves out.
    hashes = []
    running_hash = prior_hash
    for start in range(0, len(key), page_size):
        running_hash = _legacy_get_hash_str(key[start : start + page_size], running_hash)
        hashes.append(running_hash)
    return hashes


# --------------------------------------------------------------------------
# the hand-written CBOR encoder agrees with cbor2 (so _cbor_sha256 is sound)


@needs_cbor2
@pytest.mark.parametrize(
    "obj",
    [
        (b"\x00" * 32, (0, 1, 2), None),
        (b"123", (1, 2, 3), ("key1", "key2")),
        (b"\xff" * 32, (23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32), (("hash1", 0),)),
        "vllm-none-hash",
        "",
    ],
)
def test_reference_cbor_matches_cbor2_canonical(obj):
    import cbor2

    assert _cbor(obj) == cbor2.dumps(obj, canonical=True)


# --------------------------------------------------------------------------
# vLLM: formulas pinned by vLLM's own tests


@pytest.mark.parametrize(
    "value", [(), ("abc",), (None,), (None, bool, [1, 2, 3])]
)
def test_vllm_sha256_matches_upstream_test_sha256(value):
    # vllm tests/utils_/test_hashing.py::test_sha256 @ c96c471d: these inputs,
    # digest == hashlib.sha256(pickle.dumps(input, HIGHEST_PROTOCOL)).digest(),
    # and a different input gives a different digest.
    fn = hashing.vllm_hash_function("sha256")
    digest = fn(value)
    assert digest == hashlib.sha256(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    assert digest == fn(value)
    assert digest != fn(value + (1,))


@pytest.mark.parametrize("algo", SHA_ALGOS)
def test_vllm_hash_block_tokens_upstream_case(algo):
    # vllm tests/v1/core/test_kv_cache_utils.py::test_hash_block_tokens @ 002f10e0:
    #   parent_block_hash = BlockHash(b"123"); curr_block_token_ids = (1, 2, 3)
    #   extra_keys = ("key1", "key2")
    #   assert hash_block_tokens(hash_fn, parent, tokens, extra_keys)
    #          == hash_fn((parent, tokens, extra_keys))
    # No literal digest upstream: expected value from the independent formula.
    expected = REF[algo]((b"123", (1, 2, 3), ("key1", "key2")))
    got = hashing.vllm_hash_block(b"123", [1, 2, 3], ("key1", "key2"), algo)
    assert got == expected
    assert len(got) == 32


@pytest.mark.parametrize("algo", SHA_ALGOS)
def test_vllm_none_hash_upstream_cases(algo):
    # vllm tests/v1/core/test_kv_cache_utils.py::test_none_hash @ 002f10e0:
    #   PYTHONHASHSEED unset -> NONE_HASH == hash_fn(DEFAULT_NONE_HASH_SEED)
    #   PYTHONHASHSEED="python hash seed" -> NONE_HASH == hash_fn("python hash seed")
    # DEFAULT_NONE_HASH_SEED = "vllm-none-hash" (vllm/v1/core/kv_cache_utils.py @ 002f10e0).
    assert hashing.VLLM_DEFAULT_NONE_HASH_SEED == "vllm-none-hash"
    assert hashing.vllm_none_hash(None, algo) == REF[algo]("vllm-none-hash")
    assert hashing.vllm_none_hash("python hash seed", algo) == REF[algo]("python hash seed")
    # A set-but-empty PYTHONHASHSEED is a seed like any other (vLLM tests
    # `is not None`), distinct from unset.
    assert hashing.vllm_none_hash("", algo) == REF[algo]("")
    assert hashing.vllm_none_hash("", algo) != hashing.vllm_none_hash(None, algo)


@pytest.mark.parametrize("algo", SHA_ALGOS)
@pytest.mark.parametrize("seed", [None, "0", "python hash seed"])
def test_vllm_request_chain_no_mm_upstream_case(algo, seed):
    # vllm tests/v1/core/test_kv_cache_utils.py::test_hash_request_tokens_no_mm_inputs
    # @ 002f10e0: prompt_token_ids = range(6), block_size = 3:
    #   block_hashes[0] == hash_fn((NONE_HASH, (0, 1, 2), None))
    #   block_hashes[1] == hash_fn((block_hashes[0], (3, 4, 5), None))
    ref = REF[algo]
    none = ref(seed if seed is not None else "vllm-none-hash")
    h0 = ref((none, (0, 1, 2), None))
    h1 = ref((h0, (3, 4, 5), None))
    assert hashing.vllm_block_hashes(list(range(6)), 3, hash_algo=algo, seed=seed) == [h0, h1]
    # The same with an explicit NONE_HASH, and one block at a time.
    assert hashing.vllm_block_hashes(range(6), 3, hash_algo=algo, none_hash=none) == [h0, h1]
    assert hashing.vllm_hash_block(None, (0, 1, 2), None, algo, seed=seed) == h0
    assert hashing.vllm_hash_block(b"", (0, 1, 2), None, algo, none_hash=none) == h0
    assert hashing.vllm_hash_block(h0, [3, 4, 5], None, algo) == h1


@pytest.mark.parametrize("algo", SHA_ALGOS)
def test_vllm_request_chain_mm_extra_keys_upstream_case(algo):
    # vllm tests/v1/core/test_kv_cache_utils.py::test_request_block_hasher @ 002f10e0:
    # range(6), block_size 3, images at [0,3) and [3,6) with hashes "hash1", "hash2":
    #   block_hashes[0] == hash_fn((NONE_HASH, (0, 1, 2), (("hash1", 0),)))
    #   block_hashes[1] == hash_fn((block_hashes[0], (3, 4, 5), (("hash2", 0),)))
    ref = REF[algo]
    none = ref("vllm-none-hash")
    h0 = ref((none, (0, 1, 2), (("hash1", 0),)))
    h1 = ref((h0, (3, 4, 5), (("hash2", 0),)))
    got = hashing.vllm_block_hashes(
        list(range(6)), 3, hash_algo=algo, extra_keys=[(("hash1", 0),), (("hash2", 0),)]
    )
    assert got == [h0, h1]


def test_vllm_extra_keys_lora_and_salt_upstream_cases():
    # vllm tests/v1/core/test_kv_cache_utils.py @ 002f10e0:
    # test_generate_block_hash_extra_keys_cache_salt: the salt goes into the
    #   block starting at token 0 only -> ("salt",) there, None elsewhere.
    # test_generate_block_hash_extra_keys_lora: ("test_lora_adapter",), None
    #   without LoRA. Order in generate_block_hash_extra_keys: lora + mm + salt.
    assert hashing.vllm_extra_keys(0, cache_salt="salt") == ("salt",)
    assert hashing.vllm_extra_keys(1, cache_salt="salt") is None
    assert hashing.vllm_extra_keys(0, lora_name="test_lora_adapter") == ("test_lora_adapter",)
    assert hashing.vllm_extra_keys(3, lora_name="test_lora_adapter") == ("test_lora_adapter",)
    assert hashing.vllm_extra_keys(0) is None
    assert hashing.vllm_extra_keys(0, lora_name="l", cache_salt="s") == ("l", "s")


@pytest.mark.parametrize("algo", SHA_ALGOS)
def test_vllm_chain_with_salt_and_lora(algo):
    # The chain with those extra keys, from the independent formula.
    ref = REF[algo]
    none = ref("7")
    toks = list(range(100, 108))
    h0 = ref((none, (100, 101, 102, 103), ("lora-a", "salt")))
    h1 = ref((h0, (104, 105, 106, 107), ("lora-a",)))
    got = hashing.vllm_block_hashes(
        toks, 4, hash_algo=algo, seed="7", lora_name="lora-a", cache_salt="salt"
    )
    assert got == [h0, h1]
    # A salt changes every block (through the chain), not just the first.
    plain = hashing.vllm_block_hashes(toks, 4, hash_algo=algo, seed="7", lora_name="lora-a")
    assert plain[0] != got[0] and plain[1] != got[1]


def test_vllm_default_algo_is_sha256():
    # vllm/config/cache.py @ 002f10e0: prefix_caching_hash_algo default "sha256",
    # PrefixCachingHashAlgo = Literal["sha256", "sha256_cbor", "xxhash", "xxhash_cbor"].
    assert hashing.VLLM_DEFAULT_HASH_ALGO == "sha256"
    assert hashing.VLLM_HASH_ALGOS == ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")
    assert hashing.vllm_block_hashes([1, 2], 2) == hashing.vllm_block_hashes(
        [1, 2], 2, hash_algo="sha256", seed=None
    )


def test_vllm_numpy_like_ints_hash_as_python_ints():
    # vLLM holds Python ints; an object with __index__ must hash like its int.
    class Tok:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    assert hashing.vllm_block_hashes([Tok(i) for i in range(4)], 2) == hashing.vllm_block_hashes(
        list(range(4)), 2
    )


@pytest.mark.parametrize("algo", ["xxhash", "xxhash_cbor"])
def test_vllm_xxhash_algos(algo):
    xxhash = pytest.importorskip("xxhash")
    if not hasattr(xxhash, "xxh3_128_digest"):
        pytest.skip("xxhash < 3")
    if algo == "xxhash_cbor":
        pytest.importorskip("cbor2")
        ser = _cbor
    else:
        ser = lambda x: pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)  # noqa: E731
    # vllm/utils/hashing.py: xxhash / xxhash_cbor = xxh3_128_digest(pickle / CBOR bytes).
    ref = lambda x: xxhash.xxh3_128_digest(ser(x))  # noqa: E731
    none = ref("1234")
    h0 = ref((none, (0, 1, 2), None))
    assert hashing.vllm_block_hashes([0, 1, 2, 3], 3, hash_algo=algo, seed="1234") == [h0]
    assert len(h0) == 16
    # Unset PYTHONHASHSEED: vLLM draws a random seed for xxhash; not reproducible.
    with pytest.raises(ValueError, match="cannot be reproduced"):
        hashing.vllm_none_hash(None, algo)


def test_vllm_cbor_missing_raises_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "cbor2", None)  # makes `import cbor2` fail
    with pytest.raises(ImportError, match="cbor2"):
        hashing.vllm_block_hashes([1, 2, 3, 4], 2, hash_algo="sha256_cbor")
    # The stdlib algorithm still works without it.
    assert len(hashing.vllm_block_hashes([1, 2, 3, 4], 2, hash_algo="sha256")) == 2


def test_vllm_xxhash_missing_raises_clear_import_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "xxhash", None)
    with pytest.raises(ImportError, match="xxhash"):
        hashing.vllm_block_hashes([1, 2], 2, hash_algo="xxhash", seed="0")


def test_vllm_group_key_and_int_form():
    # vllm/v1/core/kv_cache_utils.py @ 002f10e0:
    #   make_block_hash_with_group_id: block_hash + group_id.to_bytes(4, "big")
    #   maybe_convert_block_hash: int.from_bytes(h, "big") & ((1 << 64) - 1)
    h = bytes(range(32))
    assert hashing.vllm_key(h) == h
    assert hashing.vllm_key(h, 0) == h + b"\x00\x00\x00\x00"
    assert hashing.vllm_key(h, 258) == h + b"\x00\x00\x01\x02"
    assert hashing.vllm_hash_to_int(h) == int.from_bytes(h[-8:], "big")
    assert hashing.vllm_hash_to_int(h) == 0x18191A1B1C1D1E1F
    with pytest.raises(ValueError, match="group_id"):
        hashing.vllm_key(h, 2**32)
    with pytest.raises(ValueError, match="group_id"):
        hashing.vllm_key(h, -1)


# --------------------------------------------------------------------------
# vLLM chain properties


@pytest.mark.parametrize("algo", SHA_ALGOS)
def test_vllm_prefix_gives_same_leading_hashes(algo):
    toks = [(i * 7919) % 50000 for i in range(16 * 5 + 3)]
    full = hashing.vllm_block_hashes(toks, 16, hash_algo=algo)
    assert len(full) == 5  # the 3 trailing tokens are not a block
    for n in range(0, len(toks) + 1):
        assert hashing.vllm_block_hashes(toks[:n], 16, hash_algo=algo) == full[: n // 16]
    assert len(set(full)) == 5


@pytest.mark.parametrize("algo", SHA_ALGOS)
def test_vllm_changing_one_token_changes_that_block_and_later(algo):
    toks = list(range(1000, 1000 + 4 * 8))
    base = hashing.vllm_block_hashes(toks, 8, hash_algo=algo)
    for pos in (0, 9, 23, 31):
        changed = list(toks)
        changed[pos] += 1
        got = hashing.vllm_block_hashes(changed, 8, hash_algo=algo)
        k = pos // 8
        assert got[:k] == base[:k]
        assert all(g != b for g, b in zip(got[k:], base[k:]))


def test_vllm_seed_changes_every_block():
    toks = list(range(12))
    a = hashing.vllm_block_hashes(toks, 4, seed="0")
    b = hashing.vllm_block_hashes(toks, 4, seed="1")
    assert all(x != y for x, y in zip(a, b))


def test_vllm_partial_and_empty():
    assert hashing.vllm_block_hashes([], 16) == []
    assert hashing.vllm_block_hashes(list(range(15)), 16) == []
    assert len(hashing.vllm_block_hashes(list(range(16)), 16)) == 1


# --------------------------------------------------------------------------
# vLLM bad input


@pytest.mark.parametrize("bs", [0, -1, -16])
def test_vllm_bad_block_size(bs):
    with pytest.raises(ValueError, match="block_size must be a positive integer"):
        hashing.vllm_block_hashes([1, 2, 3], bs)


@pytest.mark.parametrize("bs", [1.5, "16", None, True])
def test_vllm_block_size_type(bs):
    with pytest.raises(TypeError, match="block_size"):
        hashing.vllm_block_hashes([1, 2, 3], bs)


def test_vllm_negative_token():
    with pytest.raises(ValueError, match=r"token at index 2 is negative \(-5\)"):
        hashing.vllm_block_hashes([1, 2, -5, 4], 2)
    with pytest.raises(ValueError, match="negative"):
        hashing.vllm_hash_block(None, [-1])
    # Even in a trailing partial block.
    with pytest.raises(ValueError, match="negative"):
        hashing.vllm_block_hashes([1, 2, -3], 2)


@pytest.mark.parametrize("bad", [1.0, "1", None, True, b"x"])
def test_vllm_non_integer_token(bad):
    with pytest.raises(TypeError, match="token at index 1"):
        hashing.vllm_block_hashes([0, bad], 2)


def test_vllm_bad_algo_seed_parent_extra_keys():
    with pytest.raises(ValueError, match="unknown vLLM prefix_caching_hash_algo 'md5'"):
        hashing.vllm_block_hashes([1, 2], 2, hash_algo="md5")
    with pytest.raises(TypeError, match="seed"):
        hashing.vllm_none_hash(0)
    with pytest.raises(TypeError, match="parent"):
        hashing.vllm_hash_block("abc", [1])
    with pytest.raises(TypeError, match="extra_keys"):
        hashing.vllm_hash_block(None, [1], ["key"])
    with pytest.raises(ValueError, match="extra_keys has 1 entries for 2 complete blocks"):
        hashing.vllm_block_hashes([1, 2, 3, 4], 2, extra_keys=[None])
    with pytest.raises(TypeError, match="not both"):
        hashing.vllm_block_hashes([1, 2], 2, extra_keys=[None], cache_salt="s")
    with pytest.raises(TypeError, match=r"extra_keys\[0\]"):
        hashing.vllm_block_hashes([1, 2], 2, extra_keys=[["x"]])
    with pytest.raises(TypeError, match="not a string"):
        hashing.vllm_block_hashes("abcd", 2)


# --------------------------------------------------------------------------
# SGLang: published literals


def test_sglang_empty_page_is_sha256_of_nothing():
    # sglang test_mem_cache_utils.py::TestGetHashStr::test_hash_properties @ 06ab04ab:
    #   get_hash_str([]) == hashlib.sha256().hexdigest()
    # which is the FIPS 180 SHA-256 of the empty message:
    assert (
        hashing.sglang_hash_page([])
        == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )


@pytest.mark.parametrize(
    "hex_in, expected",
    [
        # sglang test_mem_cache_utils.py::TestHashStrToInt64 @ 06ab04ab, literals:
        ("0" * 64, 0),  # test_zero_hash
        ("0000000000000001" + "0" * 48, 1),  # test_small_positive_value
        ("7fffffffffffffff" + "0" * 48, 2**63 - 1),  # test_large_positive_value
        ("8000000000000000" + "0" * 48, -(2**63)),  # test_negative_overflow
        ("f" * 16 + "0" * 48, -1),  # test_max_unsigned_maps_to_minus_one
    ],
)
def test_sglang_hash_to_int64_upstream_literals(hex_in, expected):
    assert hashing.sglang_hash_to_int64(hex_in) == expected


def test_sglang_hash_to_int64_only_first_16():
    # same file, test_only_first_16_chars_matter
    assert hashing.sglang_hash_to_int64("a" * 16 + "0" * 48) == hashing.sglang_hash_to_int64(
        "a" * 16 + "f" * 48
    )


# --------------------------------------------------------------------------
# SGLang: formulas pinned by SGLang's tests


def test_sglang_hash_contract_upstream_case():
    # SGLang's tests hold get_hash_str equal to the per-token loop
    # (_legacy_get_hash_str, test_mem_cache_utils.py @ 06ab04ab): sha256 over
    # each token's 4-byte little-endian encoding. No literal digest upstream:
    # expected value from that formula, written out for [1, 2, 3].
    expected = hashlib.sha256()
    for token in [1, 2, 3]:
        expected.update(token.to_bytes(4, byteorder="little", signed=False))
    assert hashing.sglang_hash_page([1, 2, 3]) == expected.hexdigest()
    assert hashing.sglang_hash_page([1, 2, 3]) == hashlib.sha256(
        struct.pack("<3I", 1, 2, 3)
    ).hexdigest()


def test_sglang_hash_properties_upstream_case():
    # sglang test_mem_cache_utils.py::TestGetHashStr::test_hash_properties @ 06ab04ab
    h = hashing.sglang_hash_page
    assert h([1, 2, 3]) != h([3, 2, 1])
    assert h([100]) != h([200])
    assert h([1, 2]) == h([(1, 2)])  # a bigram token is its elements, in order
    assert h([(1, 2)]) != h([(2, 1)])
    chained = h([3, 4], prior_hash=h([1, 2]))
    assert chained != h([3, 4])
    assert chained != h([3, 4], prior_hash=h([9, 9]))
    for tokens in [[], [1], [1, 2, 3], [(1, 2)], [1, 2, 3, 4, 5]]:
        assert len(h(tokens)) == 64 and all(c in "0123456789abcdef" for c in h(tokens))


@pytest.mark.parametrize(
    "name, tokens, prior",
    [
        # sglang test_mem_cache_utils.py::_single_hash_compatibility_cases @ 06ab04ab
        ("plain_list", [1, 2, 3, 4, 5], None),
        ("array_q", array("q", range(1, 258)), None),
        ("array_i_with_prior", array("I", range(1, 258)), "prior:[7,8,9]"),
        ("tuple_bigram_with_prior", [(10, 20), (20, 30), (30, 40), (40, 50)], "prior:[7,8,9]"),
    ],
)
def test_sglang_single_hash_compat_cases(name, tokens, prior):
    prior_hash = _legacy_get_hash_str([7, 8, 9]) if prior else None
    assert hashing.sglang_hash_page(tokens, prior_hash) == _legacy_get_hash_str(tokens, prior_hash)


@pytest.mark.parametrize(
    "name, tokens, page_size, prior",
    [
        # sglang test_mem_cache_utils.py::_page_hash_compatibility_cases @ 06ab04ab
        ("empty_list", [], 8, False),
        ("array_q_page_64", array("q", range(1, 258)), 64, False),
        ("array_i_page_64_with_prior", array("I", range(1, 258)), 64, True),
    ],
)
def test_sglang_page_hash_compat_cases(name, tokens, page_size, prior):
    prior_hash = _legacy_get_hash_str([7, 8, 9]) if prior else None
    legacy = _legacy_page_hashes(tokens, page_size, prior_hash)
    got = hashing.sglang_page_hashes(tokens, page_size, prior_hash)
    # 257 tokens: upstream's helper also hashes the 1-token tail; ctxpod keeps
    # full pages only, which must match upstream's first 4 exactly.
    full = len(tokens) // page_size
    assert got == legacy[:full]
    assert len(got) == full


# --------------------------------------------------------------------------
# SGLang chain properties


def test_sglang_prefix_gives_same_leading_hashes():
    toks = [(i * 104729) % 151936 for i in range(64 * 4 + 10)]
    full = hashing.sglang_page_hashes(toks, 64)
    assert len(full) == 4
    for n in range(0, len(toks) + 1, 5):
        assert hashing.sglang_page_hashes(toks[:n], 64) == full[: n // 64]
    assert len(set(full)) == 4


def test_sglang_changing_one_token_changes_that_page_and_later():
    toks = list(range(5000, 5000 + 5 * 4))
    base = hashing.sglang_page_hashes(toks, 4)
    for pos in (0, 5, 13, 19):
        changed = list(toks)
        changed[pos] ^= 1
        got = hashing.sglang_page_hashes(changed, 4)
        k = pos // 4
        assert got[:k] == base[:k]
        assert all(g != b for g, b in zip(got[k:], base[k:]))


def test_sglang_pages_chain_through_prior_hash():
    toks = list(range(24))
    pages = hashing.sglang_page_hashes(toks, 8)
    assert pages[0] == hashing.sglang_hash_page(toks[0:8])
    assert pages[1] == hashing.sglang_hash_page(toks[8:16], pages[0])
    assert pages[2] == hashing.sglang_hash_page(toks[16:24], pages[1])
    # Resuming mid-sequence from a known page hash continues the chain.
    assert hashing.sglang_page_hashes(toks[8:], 8, prior_hash=pages[0]) == pages[1:]
    # "" is "no prior", as SGLang's `if prior_hash:`.
    assert hashing.sglang_page_hashes(toks, 8, prior_hash="") == pages


def test_sglang_u32_boundary():
    assert hashing.sglang_hash_page([2**32 - 1]) == hashlib.sha256(b"\xff\xff\xff\xff").hexdigest()


def test_sglang_key_and_mooncake_keys():
    h = hashing.sglang_hash_page([1, 2, 3])
    assert hashing.sglang_key(h) == bytes.fromhex(h)
    assert len(hashing.sglang_key(h)) == 32
    # python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py @ 00fe477f:
    #   MHA: f"{key}_{tp_rank}_k", f"{key}_{tp_rank}_v"; with PP f"{tp_rank}_{pp_rank}"
    #   MLA: f"{key}_{mla_suffix}_k" with mla_suffix "" (or f"{pp_rank}" with PP)
    #   prefix: "_".join([extra_backend_tag, "-".join(model_name.split("/"))]) + "_"
    assert hashing.sglang_mooncake_keys(h, tp_rank=3) == [f"{h}_3_k", f"{h}_3_v"]
    assert hashing.sglang_mooncake_keys(h, tp_rank=3, pp_rank=1, pp_size=2) == [
        f"{h}_3_1_k",
        f"{h}_3_1_v",
    ]
    assert hashing.sglang_mooncake_keys(h, is_mla=True) == [f"{h}__k"]
    assert hashing.sglang_mooncake_keys(h, is_mla=True, pp_rank=1, pp_size=2) == [f"{h}_1_k"]
    prefix = hashing.sglang_mooncake_prefix("Qwen/Qwen3-8B", "tagA")
    assert prefix == "tagA_Qwen-Qwen3-8B"
    assert hashing.sglang_mooncake_prefix() is None
    assert hashing.sglang_mooncake_keys(h, prefix=prefix) == [
        f"tagA_Qwen-Qwen3-8B_{h}_0_k",
        f"tagA_Qwen-Qwen3-8B_{h}_0_v",
    ]


# --------------------------------------------------------------------------
# SGLang bad input


@pytest.mark.parametrize("ps", [0, -1])
def test_sglang_bad_page_size(ps):
    with pytest.raises(ValueError, match="page_size must be a positive integer"):
        hashing.sglang_page_hashes([1, 2, 3], ps)


def test_sglang_token_range():
    with pytest.raises(ValueError, match=r"token at index 1 is 4294967296.*2\*\*32"):
        hashing.sglang_page_hashes([1, 2**32], 2)
    with pytest.raises(ValueError, match="2\\*\\*32"):
        hashing.sglang_hash_page([2**40])
    with pytest.raises(ValueError, match="negative"):
        hashing.sglang_hash_page([0, -1])
    with pytest.raises(ValueError, match="negative"):
        hashing.sglang_hash_page([(1, -2)])
    # Checked even in a trailing partial page.
    with pytest.raises(ValueError, match="negative"):
        hashing.sglang_page_hashes([1, 2, -3], 2)
    with pytest.raises(TypeError, match="token at index 0"):
        hashing.sglang_hash_page([1.0])


def test_sglang_bad_prior_and_key():
    with pytest.raises(ValueError, match="prior_hash is not a hex string"):
        hashing.sglang_page_hashes([1, 2], 2, prior_hash="xyz")
    with pytest.raises(TypeError, match="prior_hash"):
        hashing.sglang_hash_page([1], prior_hash=b"\x00" * 32)
    with pytest.raises(ValueError, match="64 hex characters"):
        hashing.sglang_key("ab")
    with pytest.raises(ValueError, match="not a hex string"):
        hashing.sglang_key("g" * 64)


# --------------------------------------------------------------------------
# ctxpod keys


def test_ctxpod_key_bounds():
    assert hashing.ctxpod_key(b"x") == b"x"
    assert hashing.ctxpod_key(b"x" * 128) == b"x" * 128
    with pytest.raises(ValueError, match="1..=128 bytes, got 0"):
        hashing.ctxpod_key(b"")
    with pytest.raises(ValueError, match="got 129"):
        hashing.ctxpod_key(b"x" * 129)
    with pytest.raises(TypeError):
        hashing.ctxpod_key("text")
    # Digests of both engines fit.
    assert len(hashing.vllm_key(hashing.vllm_block_hashes([1, 2], 2)[0], 7)) == 36
    assert len(hashing.sglang_key(hashing.sglang_page_hashes([1, 2], 2)[0])) == 32
