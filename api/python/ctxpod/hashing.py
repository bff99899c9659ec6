"""Block-hash chains used by vLLM and SGLang prefix caching, in pure Python.

An inference engine names each *complete* block (vLLM) or page (SGLang) of a
prompt by a hash that folds in the hash of the block before it, so a hash
names a whole prefix, not one block's contents. A KV block stored in ctxpod
under such a name can be found again by any engine instance that computes the
same chain. This module recomputes those chains outside the engines, so a
client can, for example, look a prompt's blocks up in ctxpod before it sends
the prompt anywhere.

Only complete blocks are hashed: a trailing partial block is ignored, as the
engines do (vLLM ``get_request_block_hasher`` stops at the last full block;
SGLang's ``RadixCache.cache_finished_req`` truncates a request to
``len // page_size * page_size`` tokens when ``page_size > 1``).

vLLM (v1 engine)
================

Read from ``vllm-project/vllm``:

* ``vllm/v1/core/kv_cache_utils.py`` @ 002f10e0cfa1373a19a0d2756598a34b700d20e5:
  ``hash_block_tokens``, ``init_none_hash``, ``resolve_none_hash_seed``,
  ``DEFAULT_NONE_HASH_SEED``, ``get_request_block_hasher``,
  ``generate_block_hash_extra_keys``, ``make_block_hash_with_group_id``,
  ``maybe_convert_block_hash``.
* ``vllm/utils/hashing.py`` @ ac621345a4eb18058bb24b242b457f634d476b40:
  ``sha256`` and ``sha256_cbor`` (the ``xxhash`` / ``xxhash_cbor`` variants,
  imported by kv_cache_utils.py at 002f10e0, are
  ``xxhash.xxh3_128_digest`` over the same pickle / CBOR bytes).
* ``vllm/config/cache.py`` @ 002f10e0:
  ``PrefixCachingHashAlgo = Literal["sha256", "sha256_cbor", "xxhash",
  "xxhash_cbor"]``; the default ``prefix_caching_hash_algo`` is ``"sha256"``.
* ``tests/v1/core/test_kv_cache_utils.py`` @ 002f10e0 and
  ``tests/utils_/test_hashing.py`` @ c96c471d1b439609b5822c5becfe4c22863db545.

The chain::

    hash_fn = {"sha256":      sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)),
               "sha256_cbor": sha256(cbor2.dumps(x, canonical=True)),
               "xxhash":      xxh3_128(pickle.dumps(x, HIGHEST_PROTOCOL)),
               "xxhash_cbor": xxh3_128(cbor2.dumps(x, canonical=True))}[algo]
    NONE_HASH = hash_fn(seed)                       # seed is a str, see below
    block[i]  = hash_fn((parent or NONE_HASH, tuple(tokens_i), extra_keys_i))

``parent`` is the previous block's digest (raw bytes); vLLM substitutes
NONE_HASH whenever the parent is falsy (``None`` or ``b""``). ``extra_keys_i``
is a tuple or ``None``; for a block it is
``tuple(lora_keys + mm_keys + cache_salt_keys + prompt_embeds_keys)`` or
``None`` when that list is empty, where ``lora_keys = [lora_name]`` and the
cache salt goes only into the block that starts at token 0.

NONE_HASH seed: ``PYTHONHASHSEED`` if set (any string, even ``""``), else
``DEFAULT_NONE_HASH_SEED = "vllm-none-hash"`` for sha256 / sha256_cbor, else
(xxhash algorithms) 32 random bytes' hex, i.e. not reproducible. The fixed
default seed arrived with vLLM PR #51875 ("Make prefix-cache NONE_HASH
deterministic by default", merged 2026-08); older vLLM used ``os.urandom(32)``
as NONE_HASH when PYTHONHASHSEED was unset, which no one can reproduce: with
those versions set PYTHONHASHSEED on the engine and pass the same value here.

What vLLM pins and what it does not: vLLM publishes **no literal digest**.
Its tests pin formulas only: ``test_hash_block_tokens`` (the result equals
``hash_fn((parent, tokens, extra_keys))``), ``test_request_block_hasher`` /
``test_hash_request_tokens_no_mm_inputs`` (the chain over ``range(6)`` with
block size 3), ``test_none_hash`` (``NONE_HASH == hash_fn(seed)``, and
``hash_fn(DEFAULT_NONE_HASH_SEED)`` without a seed) and
``tests/utils_/test_hashing.py::test_sha256`` (``sha256(x) ==
hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()``).
Not pinned: the bytes themselves. The "sha256" digests depend on CPython's
pickle (``HIGHEST_PROTOCOL`` is 5 from CPython 3.8 on), so they match vLLM
only when computed by a CPython with the same highest protocol; the CBOR
algorithms are language-independent (RFC 8949 shortest-form encoding).

Also from the source: with several KV cache groups vLLM hashes at
``hash_block_size`` granularity (the GCD of the groups' block sizes unless
``prefix_match_unit`` is set), so pass that as ``block_size``; the in-GPU key
is ``block_hash + group_id.to_bytes(4, "big")`` (:func:`vllm_key` with
``group_id``); KV events carry ``int.from_bytes(h, "big") & (2**64 - 1)`` when
``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is set (:func:`vllm_hash_to_int`).
Multimodal extra keys (``(mm_identifier, offset_in_block)`` tuples) and
prompt-embeds keys are not built here; pass them per block in ``extra_keys``.

SGLang (HiCache / radix cache page hash)
========================================

Read from ``sgl-project/sglang``:

* ``python/sglang/srt/utils/hashing.py`` @ 4d374af2ff141166b2d28872a66851e6d9c86bf6:
  ``get_hash_str(token_ids, prior_hash=None)`` and ``hash_str_to_int64``
  (older trees define the same function in
  ``python/sglang/srt/mem_cache/hicache_storage.py``; newer ones in
  ``python/sglang/srt/mem_cache/utils.py`` behind a native implementation that
  SGLang's tests hold equal to the per-token loop).
* ``test/registered/unit/mem_cache/test_mem_cache_utils.py`` @
  06ab04abc53fef1bd3b3dbdae760c2f3a18d13b8 (``_legacy_get_hash_str``,
  ``_legacy_page_hashes``, ``TestGetHashStr``, ``TestHashStrToInt64``).
* ``python/sglang/srt/mem_cache/storage/mooncake_store/mooncake_store.py`` @
  00fe477f32b3878f64d44cc36895e1de4a113afe (object key layout).
* ``python/sglang/srt/mem_cache/storage/hf3fs/storage_hf3fs.py`` @
  01f5f368b4eaf5312316f75046ba3b1ea3c12fd4 (3FS key layout).

The chain::

    page[i] = sha256( bytes.fromhex(page[i-1]) if i > 0 and a prior is given
                      || b"".join(t.to_bytes(4, "little") for t in page_tokens_i)
                    ).hexdigest()                     # 64 lowercase hex chars

An EAGLE "bigram" token ``(a, b)`` contributes ``a`` then ``b`` as 4-byte
little-endian words. SGLang publishes literal vectors only for
``hash_str_to_int64`` and, implicitly, ``get_hash_str([]) ==
hashlib.sha256().hexdigest()``; the rest of its tests pin the formula above.
Some newer SGLang trees seed a storage chain with a namespace digest when a
request has ``extra_key`` / ``cache_salt``; that seed is not computed here:
pass it as ``prior_hash`` if your SGLang does it.

How SGLang's backends name objects (for interop, not needed by ctxpod): the
Mooncake backend stores, per page hash ``H`` and optional prefix ``P``
(``"_".join([extra_backend_tag, model_name.replace("/", "-")])`` of those that
are set), MHA as ``[P_]H_{tp_rank}_k`` and ``[P_]H_{tp_rank}_v`` (with
pipeline parallelism ``{tp_rank}_{pp_rank}``), MLA as ``[P_]H__k`` (an empty
rank suffix, so two underscores; with PP ``H_{pp_rank}_k``): see
:func:`sglang_mooncake_keys`. The 3FS backend keeps a key index per TP rank in
its metadata server and, for MHA zero-copy layouts, stores ``H-k`` and ``H-v``.

ctxpod keys
===========

ctxpod keys are 1..=128 raw bytes. :func:`vllm_key` uses the digest bytes
as they are (32 bytes for sha256 / sha256_cbor, 16 for the xxhash
algorithms; 36 / 20 with a group id). :func:`sglang_key` uses
``bytes.fromhex(h)``, the 32 raw digest bytes, rather than the 64 ASCII hex
characters, so the same digest is the same key whichever form it came in.
The two engines' chains are different functions of the tokens, so their keys
never coincide by design; keep them in separate ctxpod namespaces anyway.

Dependencies: only the standard library for "sha256" and SGLang.
"sha256_cbor" / "xxhash_cbor" need the PyPI package ``cbor2`` and the xxhash
algorithms the PyPI package ``xxhash`` (>= 3, for ``xxh3_128_digest``); both
are imported on first use and their absence raises :class:`ImportError`
naming the package.
"""

from __future__ import annotations

import hashlib
import operator
import pickle
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "VLLM_HASH_ALGOS",
    "VLLM_DEFAULT_HASH_ALGO",
    "VLLM_DEFAULT_NONE_HASH_SEED",
    "CTXPOD_MAX_KEY_LEN",
    "vllm_hash_function",
    "vllm_none_hash",
    "vllm_hash_block",
    "vllm_extra_keys",
    "vllm_block_hashes",
    "vllm_key",
    "vllm_hash_to_int",
    "sglang_hash_page",
    "sglang_page_hashes",
    "sglang_key",
    "sglang_hash_to_int64",
    "sglang_mooncake_prefix",
    "sglang_mooncake_keys",
    "ctxpod_key",
]

#: The names vLLM accepts for ``--prefix-caching-hash-algo``
#: (``PrefixCachingHashAlgo`` in vllm/config/cache.py).
VLLM_HASH_ALGOS: tuple[str, ...] = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")

#: vLLM's default ``prefix_caching_hash_algo``.
VLLM_DEFAULT_HASH_ALGO = "sha256"

#: ``DEFAULT_NONE_HASH_SEED`` in vllm/v1/core/kv_cache_utils.py: the seed of
#: NONE_HASH for sha256 / sha256_cbor when PYTHONHASHSEED is unset.
VLLM_DEFAULT_NONE_HASH_SEED = "vllm-none-hash"

#: The longest key ctxpod accepts, in bytes.
CTXPOD_MAX_KEY_LEN = 128

_NON_CRYPTO_ALGOS = frozenset({"xxhash", "xxhash_cbor"})
_U32_LIMIT = 1 << 32


# --------------------------------------------------------------------------
# validation helpers


def _check_block_size(value: Any, name: str) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an integer, got bool")
    try:
        value = int(operator.index(value))
    except TypeError:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}") from None
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def _token(t: Any, index: int, limit: int | None) -> int:
    """One token id as a plain int, or a clear error."""
    if isinstance(t, bool):
        raise TypeError(f"token at index {index} is a bool ({t!r}), not a token id")
    try:
        v = operator.index(t)
    except TypeError:
        raise TypeError(
            f"token at index {index} must be an integer, got {type(t).__name__}"
        ) from None
    v = int(v)
    if v < 0:
        raise ValueError(f"token at index {index} is negative ({v}); token ids are >= 0")
    if limit is not None and v >= limit:
        raise ValueError(
            f"token at index {index} is {v}, which does not fit the 4-byte unsigned "
            f"little-endian encoding SGLang hashes (must be < 2**32)"
        )
    return v


def _tokens(token_ids: Sequence[Any], limit: int | None) -> list[int]:
    if isinstance(token_ids, (str, bytes, bytearray)):
        raise TypeError("token_ids must be a sequence of integers, not a string or bytes")
    return [_token(t, i, limit) for i, t in enumerate(token_ids)]


# --------------------------------------------------------------------------
# vLLM


def _import_cbor2() -> Any:
    try:
        import cbor2
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the vLLM 'sha256_cbor' and 'xxhash_cbor' block hashes need the PyPI "
            "package 'cbor2' (pip install cbor2)"
        ) from e
    return cbor2


def _import_xxhash() -> Any:
    try:
        import xxhash
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the vLLM 'xxhash' and 'xxhash_cbor' block hashes need the PyPI "
            "package 'xxhash' >= 3 (pip install xxhash)"
        ) from e
    if not hasattr(xxhash, "xxh3_128_digest"):  # pragma: no cover
        raise ImportError(
            "the installed 'xxhash' package has no xxh3_128_digest; "
            "vLLM's xxhash algorithms need xxhash >= 3 (pip install -U xxhash)"
        )
    return xxhash


def _check_algo(hash_algo: str) -> str:
    if hash_algo not in VLLM_HASH_ALGOS:
        raise ValueError(
            f"unknown vLLM prefix_caching_hash_algo {hash_algo!r}; "
            f"expected one of {', '.join(VLLM_HASH_ALGOS)}"
        )
    return hash_algo


def vllm_hash_function(hash_algo: str = VLLM_DEFAULT_HASH_ALGO) -> Callable[[Any], bytes]:
    """Return vLLM's hash function for a ``prefix_caching_hash_algo`` name.

    Mirrors ``vllm.utils.hashing.get_hash_fn_by_name``: ``"sha256"`` is
    SHA-256 of ``pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)``,
    ``"sha256_cbor"`` SHA-256 of ``cbor2.dumps(x, canonical=True)``,
    ``"xxhash"`` / ``"xxhash_cbor"`` ``xxhash.xxh3_128_digest`` of the same
    pickle / CBOR bytes. The optional packages are imported here, on first
    use, and their absence raises :class:`ImportError`.

    Raises:
        ValueError: ``hash_algo`` is not one of :data:`VLLM_HASH_ALGOS`.
        ImportError: ``cbor2`` or ``xxhash`` is needed and not installed.
    """
    _check_algo(hash_algo)
    if hash_algo == "sha256":
        return lambda x: hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    if hash_algo == "sha256_cbor":
        cbor2 = _import_cbor2()
        return lambda x: hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()
    xxhash = _import_xxhash()
    if hash_algo == "xxhash":
        return lambda x: xxhash.xxh3_128_digest(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))
    cbor2 = _import_cbor2()
    return lambda x: xxhash.xxh3_128_digest(cbor2.dumps(x, canonical=True))


def vllm_none_hash(seed: str | None = None, hash_algo: str = VLLM_DEFAULT_HASH_ALGO) -> bytes:
    """vLLM's ``NONE_HASH`` (the parent of the first block) for a seed.

    Args:
        seed: the engine's ``PYTHONHASHSEED`` value, or ``None`` if it is
            unset. ``""`` is a set (empty) value, as in vLLM.
        hash_algo: the engine's ``prefix_caching_hash_algo``.

    Returns:
        ``hash_fn(seed)``, or ``hash_fn("vllm-none-hash")`` when ``seed`` is
        ``None`` and the algorithm is sha256 / sha256_cbor (vLLM >= PR #51875).

    Raises:
        ValueError: ``seed`` is ``None`` with an xxhash algorithm: vLLM then
            draws a random per-process seed that cannot be reproduced.
        TypeError: ``seed`` is not a string.
    """
    _check_algo(hash_algo)
    if seed is None:
        if hash_algo in _NON_CRYPTO_ALGOS:
            raise ValueError(
                f"vLLM seeds NONE_HASH randomly for {hash_algo!r} when PYTHONHASHSEED "
                "is unset, so its block hashes cannot be reproduced; set PYTHONHASHSEED "
                "on the engine and pass the same value as seed"
            )
        seed = VLLM_DEFAULT_NONE_HASH_SEED
    elif not isinstance(seed, str):
        raise TypeError(f"seed must be a str (a PYTHONHASHSEED value) or None, got {type(seed).__name__}")
    return vllm_hash_function(hash_algo)(seed)


def vllm_hash_block(
    parent: bytes | None,
    tokens: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
    hash_algo: str = VLLM_DEFAULT_HASH_ALGO,
    *,
    none_hash: bytes | None = None,
    seed: str | None = None,
) -> bytes:
    """Hash one block, as ``vllm.v1.core.kv_cache_utils.hash_block_tokens``.

    Computes ``hash_fn((parent or NONE_HASH, tuple(tokens), extra_keys))``.

    Args:
        parent: the previous block's digest, or ``None`` (or ``b""``) for the
            first block, which then chains from NONE_HASH.
        tokens: the block's token ids (non-negative integers; numpy integers
            are taken as the Python ints vLLM would hold). vLLM hashes full
            blocks only; this function hashes whatever it is given.
        extra_keys: the block's extra keys tuple, or ``None``.
        hash_algo: the engine's ``prefix_caching_hash_algo``.
        none_hash: NONE_HASH to use for a missing parent; by default
            ``vllm_none_hash(seed, hash_algo)``.
        seed: the engine's PYTHONHASHSEED (``None``: unset); ignored when
            ``none_hash`` is given.

    Raises:
        ValueError: a negative token, an unknown algorithm, or a
            non-reproducible NONE_HASH (see :func:`vllm_none_hash`).
        TypeError: a non-integer token, a non-bytes parent, or ``extra_keys``
            that is neither a tuple nor ``None``.
    """
    hash_fn = vllm_hash_function(hash_algo)
    toks = tuple(_tokens(tokens, None))
    if parent is not None and not isinstance(parent, bytes):
        raise TypeError(f"parent must be bytes or None, got {type(parent).__name__}")
    if extra_keys is not None and not isinstance(extra_keys, tuple):
        raise TypeError(f"extra_keys must be a tuple or None, got {type(extra_keys).__name__}")
    if not parent:
        parent = _resolve_none_hash(none_hash, seed, hash_algo)
    return hash_fn((parent, toks, extra_keys))


def _resolve_none_hash(none_hash: bytes | None, seed: str | None, hash_algo: str) -> bytes:
    if none_hash is None:
        return vllm_none_hash(seed, hash_algo)
    if not isinstance(none_hash, bytes) or not none_hash:
        raise TypeError("none_hash must be non-empty bytes or None")
    return none_hash


def vllm_extra_keys(
    block_index: int,
    *,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> tuple[Any, ...] | None:
    """The extra keys vLLM gives a block of a text-only request.

    Mirrors ``generate_block_hash_extra_keys`` without multimodal inputs and
    prompt embeddings: ``[lora_name]`` for a LoRA request, plus the cache salt
    on the block that starts at token 0 only; ``None`` if both are absent.
    (vLLM adds the salt only when it is truthy, so ``""`` adds nothing.)
    """
    keys: list[Any] = []
    if lora_name is not None:
        keys.append(lora_name)
    if block_index == 0 and cache_salt:
        keys.append(cache_salt)
    return tuple(keys) if keys else None


def vllm_block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    *,
    hash_algo: str = VLLM_DEFAULT_HASH_ALGO,
    none_hash: bytes | None = None,
    seed: str | None = None,
    extra_keys: Sequence[tuple[Any, ...] | None] | None = None,
    lora_name: str | None = None,
    cache_salt: str | None = None,
) -> list[bytes]:
    """The block hashes vLLM computes for a prompt, one per complete block.

    As ``get_request_block_hasher(block_size, hash_fn)`` over a fresh request:
    block ``i`` covers ``token_ids[i*block_size:(i+1)*block_size]`` and
    chains from block ``i-1`` (block 0 from NONE_HASH); a trailing partial
    block is not hashed (its tokens are still checked). The result for a
    prefix of a prompt is a prefix of the prompt's result.

    Args:
        token_ids: the prompt's token ids.
        block_size: the engine's hash block size in tokens (its
            ``--block-size``, or ``hash_block_size`` with several KV groups).
        hash_algo: the engine's ``prefix_caching_hash_algo``; vLLM's default
            is ``"sha256"``.
        none_hash: NONE_HASH, if already known; by default
            ``vllm_none_hash(seed, hash_algo)``.
        seed: the engine's PYTHONHASHSEED (``None``: unset).
        extra_keys: one extra-keys tuple (or ``None``) per complete block, for
            callers that build multimodal / prompt-embeds keys themselves;
            entries past the last complete block are ignored. Excludes
            ``lora_name`` and ``cache_salt``.
        lora_name: the LoRA adapter name of the request, if any.
        cache_salt: the request's ``cache_salt``, if any.

    Raises:
        ValueError: ``block_size`` < 1, a negative token, too few
            ``extra_keys``, an unknown algorithm, or a non-reproducible
            NONE_HASH.
        TypeError: a non-integer ``block_size`` or token, or ``extra_keys``
            given together with ``lora_name`` / ``cache_salt``.
    """
    block_size = _check_block_size(block_size, "block_size")
    toks = _tokens(token_ids, None)
    n_blocks = len(toks) // block_size
    if extra_keys is not None:
        if lora_name is not None or cache_salt is not None:
            raise TypeError("give either extra_keys or lora_name/cache_salt, not both")
        if len(extra_keys) < n_blocks:
            raise ValueError(
                f"extra_keys has {len(extra_keys)} entries for {n_blocks} complete blocks"
            )
    hash_fn = vllm_hash_function(hash_algo)
    parent = _resolve_none_hash(none_hash, seed, hash_algo)
    out: list[bytes] = []
    for i in range(n_blocks):
        if extra_keys is not None:
            ek = extra_keys[i]
            if ek is not None and not isinstance(ek, tuple):
                raise TypeError(f"extra_keys[{i}] must be a tuple or None, got {type(ek).__name__}")
        else:
            ek = vllm_extra_keys(i, lora_name=lora_name, cache_salt=cache_salt)
        block = tuple(toks[i * block_size : (i + 1) * block_size])
        parent = hash_fn((parent, block, ek))
        out.append(parent)
    return out


def vllm_key(block_hash: bytes, group_id: int | None = None) -> bytes:
    """A ctxpod key for a vLLM block hash.

    The raw digest bytes; with ``group_id``, vLLM's ``BlockHashWithGroupId``
    layout ``block_hash + group_id.to_bytes(4, "big")``.

    Raises:
        TypeError: ``block_hash`` is not bytes.
        ValueError: the key would be empty or longer than 128 bytes, or
            ``group_id`` is outside 0..2**32-1.
    """
    if not isinstance(block_hash, (bytes, bytearray)):
        raise TypeError(f"block_hash must be bytes, got {type(block_hash).__name__}")
    key = bytes(block_hash)
    if group_id is not None:
        if isinstance(group_id, bool) or not isinstance(group_id, int):
            raise TypeError("group_id must be an int")
        if not 0 <= group_id < _U32_LIMIT:
            raise ValueError(f"group_id must be in 0..2**32-1, got {group_id}")
        key += group_id.to_bytes(4, "big", signed=False)
    return ctxpod_key(key)


def vllm_hash_to_int(block_hash: bytes) -> int:
    """vLLM's 64-bit KV-event form of a block hash.

    ``int.from_bytes(h, "big") & (2**64 - 1)``, the low 64 bits, as
    ``maybe_convert_block_hash`` when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``
    is set.
    """
    if not isinstance(block_hash, (bytes, bytearray)):
        raise TypeError(f"block_hash must be bytes, got {type(block_hash).__name__}")
    return int.from_bytes(block_hash, byteorder="big") & ((1 << 64) - 1)


# --------------------------------------------------------------------------
# SGLang


def _check_prior(prior_hash: str | None) -> bytes:
    if not prior_hash:  # SGLang: `if prior_hash:` -- None and "" mean "no prior"
        if prior_hash is not None and not isinstance(prior_hash, str):
            raise TypeError(f"prior_hash must be a hex str or None, got {type(prior_hash).__name__}")
        return b""
    if not isinstance(prior_hash, str):
        raise TypeError(f"prior_hash must be a hex str or None, got {type(prior_hash).__name__}")
    try:
        return bytes.fromhex(prior_hash)
    except ValueError:
        raise ValueError(f"prior_hash is not a hex string: {prior_hash!r}") from None


def _sglang_words(token_ids: Sequence[Any]) -> list[bytes]:
    """Each token's bytes as SGLang hashes them (all tokens checked first)."""
    if isinstance(token_ids, (str, bytes, bytearray)):
        raise TypeError("token_ids must be a sequence of integers, not a string or bytes")
    out: list[bytes] = []
    for i, t in enumerate(token_ids):
        if isinstance(t, tuple):  # EAGLE bigram: each element, in order
            out.append(b"".join(_token(e, i, _U32_LIMIT).to_bytes(4, "little") for e in t))
        else:
            out.append(_token(t, i, _U32_LIMIT).to_bytes(4, "little"))
    return out


def _sglang_digest(prior: bytes, words: Sequence[bytes]) -> str:
    h = hashlib.sha256(prior)
    h.update(b"".join(words))
    return h.hexdigest()


def sglang_hash_page(token_ids: Sequence[int], prior_hash: str | None = None) -> str:
    """Hash one page, as SGLang's ``get_hash_str(token_ids, prior_hash)``.

    SHA-256 over ``bytes.fromhex(prior_hash)`` (when given) followed by each
    token as 4 bytes unsigned little-endian; a tuple token (EAGLE bigram)
    contributes each of its elements. Returns 64 lowercase hex characters.
    SGLang hashes full pages only; this function hashes what it is given.

    Raises:
        ValueError: a negative token, a token >= 2**32, or a non-hex prior.
        TypeError: a non-integer token or a non-str prior.
    """
    words = _sglang_words(token_ids)
    return _sglang_digest(_check_prior(prior_hash), words)


def sglang_page_hashes(
    token_ids: Sequence[int], page_size: int, prior_hash: str | None = None
) -> list[str]:
    """The page hashes SGLang HiCache computes for a prompt, one per full page.

    Page ``i`` is ``sglang_hash_page(token_ids[i*page_size:(i+1)*page_size],
    page[i-1])``, page 0 chained from ``prior_hash`` (``None`` at the start of
    a sequence). A trailing partial page is not hashed (its tokens are still
    checked).

    Raises:
        ValueError: ``page_size`` < 1, a negative token, a token >= 2**32, or
            a non-hex prior.
        TypeError: a non-integer ``page_size`` or token.
    """
    page_size = _check_block_size(page_size, "page_size")
    words = _sglang_words(token_ids)
    prior = _check_prior(prior_hash)
    out: list[str] = []
    for i in range(len(words) // page_size):
        h = _sglang_digest(prior, words[i * page_size : (i + 1) * page_size])
        out.append(h)
        prior = bytes.fromhex(h)
    return out


def sglang_key(page_hash: str) -> bytes:
    """A ctxpod key for an SGLang page hash: its 32 raw digest bytes.

    Raises:
        ValueError: ``page_hash`` is not 64 hex characters.
        TypeError: ``page_hash`` is not a str.
    """
    if not isinstance(page_hash, str):
        raise TypeError(f"page_hash must be a str, got {type(page_hash).__name__}")
    if len(page_hash) != 64:
        raise ValueError(f"an SGLang page hash is 64 hex characters, got {len(page_hash)}")
    try:
        raw = bytes.fromhex(page_hash)
    except ValueError:
        raise ValueError(f"page_hash is not a hex string: {page_hash!r}") from None
    return ctxpod_key(raw)


def sglang_hash_to_int64(page_hash: str) -> int:
    """SGLang's ``hash_str_to_int64``: the first 16 hex digits as a signed int64."""
    if not isinstance(page_hash, str):
        raise TypeError(f"page_hash must be a str, got {type(page_hash).__name__}")
    try:
        u = int(page_hash[:16], 16)
    except ValueError:
        raise ValueError(f"page_hash is not a hex string: {page_hash!r}") from None
    return u - (1 << 64) if u >= (1 << 63) else u


def sglang_mooncake_prefix(
    model_name: str | None = None, extra_backend_tag: str | None = None
) -> str | None:
    """The key prefix SGLang's Mooncake backend puts before each page hash.

    ``"_".join`` of ``extra_backend_tag`` (when set) and ``model_name`` with
    ``/`` turned into ``-`` (when set and non-empty); ``None`` when neither is.
    """
    parts: list[str] = []
    if extra_backend_tag is not None:
        parts.append(str(extra_backend_tag))
    if model_name:
        parts.append("-".join(model_name.split("/")))
    return "_".join(parts) if parts else None


def sglang_mooncake_keys(
    page_hash: str,
    *,
    tp_rank: int = 0,
    is_mla: bool = False,
    pp_rank: int = 0,
    pp_size: int = 1,
    prefix: str | None = None,
) -> list[str]:
    """The Mooncake object keys SGLang's HiCache Mooncake backend uses for a page.

    MHA: ``[prefix_]H_{r}_k`` and ``[prefix_]H_{r}_v`` with ``r = tp_rank``,
    or ``tp_rank_pp_rank`` when ``pp_size > 1``. MLA: ``[prefix_]H__k``, or
    ``[prefix_]H_{pp_rank}_k`` when ``pp_size > 1``. (The head-split layout
    used when TP sizes differ, and the hybrid-model side pools, are not
    covered.)
    """
    key = f"{prefix}_{page_hash}" if prefix is not None else page_hash
    if pp_size > 1:
        mha_suffix, mla_suffix = f"{tp_rank}_{pp_rank}", f"{pp_rank}"
    else:
        mha_suffix, mla_suffix = f"{tp_rank}", ""
    if is_mla:
        return [f"{key}_{mla_suffix}_k"]
    return [f"{key}_{mha_suffix}_k", f"{key}_{mha_suffix}_v"]


# --------------------------------------------------------------------------
# ctxpod


def ctxpod_key(key: bytes) -> bytes:
    """Check that ``key`` is a valid ctxpod key (1..=128 bytes) and return it.

    Raises:
        TypeError: ``key`` is not bytes.
        ValueError: ``key`` is empty or longer than 128 bytes.
    """
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError(f"a ctxpod key is bytes, got {type(key).__name__}")
    if not 1 <= len(key) <= CTXPOD_MAX_KEY_LEN:
        raise ValueError(
            f"a ctxpod key is 1..={CTXPOD_MAX_KEY_LEN} bytes, got {len(key)}"
        )
    return bytes(key)
