"""The llama.cpp backend: a GGUF target on llama.cpp's CPU kernels, verified as draft trees by the same engine.

The tree engine (:mod:`ooospec.runtime.engine`) asks a backend for a :class:`~ooospec.runtime.backends.target.Target`: a
KV cache owner with ``prefill``, ``forward_tree`` (one forward over a token tree on top of the cache, logits for every
node) and ``commit`` (keep the accepted root path), and the facts around it. :class:`LlamaCppTarget` is that on
llama.cpp, through its Python bindings (``llama-cpp-python``, low-level API); its cache,
:class:`~ooospec.runtime.backends.llamacpp_kv.LlamaCppKV`, verifies a tree as one multi-sequence batch. The engine's
drafters, budget policy and greedy acceptance run unchanged on quantized weights::

    target = LlamaCppTarget("qwen2.5-coder-0.5b.gguf", threads=2)     # or load_target(name, backend="llama.cpp")
    engine = SpecEngine(target, drafters, eos_token_ids=target.eos_token_ids())
    engine.generate(prompt_ids, 256)

Numerics. llama.cpp's CPU matmuls pick kernels by batch size (a one-token forward runs matrix-vector dots; a
batch may run repacked or tiled matrix-matrix kernels with another accumulation order), so a token scored inside
a 16-node tree can get logits that differ in the last bits from the same token scored alone. The engine's
exactness contract is "greedy output of the same backend": acceptance stops before any choice whose top-2 margin
is below the target's ``tie_margin`` and takes that token from a one-token forward, like the bf16 HF path. The
margin is measured per file and machine (:func:`batch_shape_diff`, twice the largest logit difference between a
16-token forward and one-token forwards, at least :data:`TIE_MARGIN`): 0.30 -> 0.6 on the registry's 0.5B Qwen
GGUF, 0.68 -> 1.36 on the 1.5B one (``python -m ooospec.eval.substrate``, EPYC Zen 4, 2 threads).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ooospec.runtime.backends.llamacpp_kv import LlamaCppKV
from ooospec.runtime.tree import chain_tree

if TYPE_CHECKING:
    from ooospec.runtime.backends.cost_model import Footprint

logger = logging.getLogger(__name__)


BACKEND = "llama.cpp"
# The smallest tie margin of the backend: a choice inside a multi-token forward whose top-2 margin is below the
# target's ``tie_margin`` (this, or twice its measured batch-shape difference: :func:`batch_shape_diff`) is
# re-taken by a one-token forward; bench mismatches are classified near-tie below the same margin.
TIE_MARGIN = 0.5
DEFAULT_CTX = 4096
DEFAULT_MAX_LEAVES = 64
INSTALL_HINT = ("the llama.cpp backend needs llama-cpp-python: `python -m ooospec.llamacpp_install` builds it for "
                "this CPU (10-30 minutes on 2 cores, then cached per CPU)")


def available() -> tuple[bool, str]:
    """``(True, version)`` when the llama.cpp bindings import, else ``(False, why)``."""
    try:
        import llama_cpp
    except Exception as e:  # noqa: BLE001 - an ImportError or a broken shared library (OSError)
        return False, f"llama_cpp does not import ({type(e).__name__}: {e})"
    return True, getattr(llama_cpp, "__version__", "?")


def _lib():
    import llama_cpp

    return llama_cpp


_BACKEND_READY = False
_BACKEND_LOCK = threading.Lock()


def _init_backend() -> None:
    global _BACKEND_READY
    with _BACKEND_LOCK:
        if not _BACKEND_READY:
            L = _lib()
            L.llama_log_set(_QUIET_LOG, ctypes.c_void_p(0))
            L.llama_backend_init()
            _BACKEND_READY = True


def _quiet_log(level, text, user_data):  # llama.cpp logs every tensor at load; keep errors only
    if level == 4:   # GGML_LOG_LEVEL_ERROR (5 = CONT continues any level: dropped)
        logger.error(text.decode("utf-8", errors="replace").rstrip())


try:
    import llama_cpp as _L

    _QUIET_LOG = _L.llama_log_callback(_quiet_log)
    _NO_PROGRESS = _L.llama_progress_callback(lambda progress, user_data: True)
except Exception:  # noqa: BLE001 - bindings missing: nothing to register
    _QUIET_LOG = _NO_PROGRESS = None


@dataclass(frozen=True)
class GGUFShape:
    """The transformer's shape from the GGUF's metadata (``<arch>.block_count``, ``<arch>.attention.head_count``,
    ...); what the KV byte counts and the roofline need."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int

    @property
    def head_dim(self) -> int:
        return self.hidden_size // max(self.num_heads, 1)

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2   # f16 K and V cells

    @classmethod
    def from_metadata(cls, meta: dict[str, str]) -> GGUFShape:
        arch = meta.get("general.architecture", "?")

        def num(key: str, default: int = 0) -> int:
            try:
                return int(meta.get(f"{arch}.{key}", default))
            except ValueError:
                return default

        heads = num("attention.head_count", 1)
        return cls(num("block_count"), num("embedding_length"), heads, num("attention.head_count_kv", heads))


def default_repack() -> tuple[bool, str]:
    """``(repack, why)``: llama.cpp's extra weight buffers (repacked / AMX kernels) everywhere but on CPUs with AMX,
    where llama.cpp 0.3.36's AMX matmul segfaults on the registry's Q4_K GGUFs at the first forward (every batch
    size, stock ``Llama`` too; llama.cpp#20824, open; seen on a 2-core Sapphire Rapids Xeon). Off, llama.cpp
    runs its generic kernels there: slower batches, same file."""
    from ooospec.runtime.backends.hardware import cpu_info

    if "amx_int8" in cpu_info()["flags"]:
        return False, "the CPU has AMX: llama.cpp's AMX matmul segfaults (llama.cpp#20824), extra buffers off"
    return True, "llama.cpp's default"


def _load_model(path: Path, repack: bool):
    L = _lib()
    mparams = L.llama_model_default_params()
    mparams.progress_callback = _NO_PROGRESS   # llama.cpp prints a dot per loaded chunk otherwise
    mparams.use_extra_bufts = bool(repack)
    model = L.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        raise RuntimeError(f"llama.cpp could not load {path}")
    return model


def _new_context(target: LlamaCppTarget, flash_attn: bool):
    L = _lib()
    cparams = L.llama_context_default_params()
    cparams.n_ctx = target.n_ctx
    cparams.n_batch = cparams.n_ubatch = target.n_batch
    cparams.n_seq_max = target.max_leaves
    cparams.n_threads = cparams.n_threads_batch = target.threads
    cparams.kv_unified = True     # a cell shared by several tree paths is one cell with several sequence ids
    # Flash attention on the CPU accumulates V in fp16 in the cells' physical order, and a tree's accepted path
    # need not sit in positional order (rejected siblings leave holes): the same context would give
    # order-dependent logits (0.03 on a tiny Q4_0 model). The plain path accumulates in fp32.
    cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cparams.no_perf = True
    ctx = L.llama_init_from_model(target._model, cparams)
    if not ctx:
        raise RuntimeError(f"llama.cpp could not create a context for {target.path} (n_ctx={target.n_ctx})")
    return ctx


def _apply_lora(target: LlamaCppTarget, lora: str | os.PathLike):
    L = _lib()
    adapter = L.llama_adapter_lora_init(target._model, str(lora).encode())
    if not adapter:
        raise RuntimeError(f"llama.cpp could not load the LoRA adapter {lora}")
    adapters = (L.llama_adapter_lora_p_ctypes * 1)(adapter)
    scales = (ctypes.c_float * 1)(1.0)
    L.llama_set_adapters_lora(target._ctx, adapters, 1, scales)
    return adapter


class LlamaCppTarget:
    """A GGUF model and one llama.cpp context (batch 1, unified KV, up to ``max_leaves`` tree leaves): a
    :class:`~ooospec.runtime.backends.target.Target`.

    Args:
        path: the ``.gguf`` file.
        threads: llama.cpp threads for decoding and batches (None: the cores this process may use).
        n_ctx: context length (prompt + output + the widest tree).
        max_leaves: most root-to-leaf paths a verified tree may have (sequence ids of the context).
        n_batch: the largest batch one ``llama_decode`` takes (prefills are split into chunks of it).
        lora: optional GGUF LoRA adapter applied with scale 1.
        flash_attn: llama.cpp's flash attention (off by default: see the note in :func:`_new_context`).
        repack: let llama.cpp repack weights at load for its batched CPU kernels (None: :func:`default_repack`,
            its default except on AMX CPUs).
    """

    backend = BACKEND
    device = torch.device("cpu")
    # T(n) is step-shaped: llama.cpp's repacked CPU kernels multiply query rows in groups of 4 and the rest one at a
    # time, so the forward cost is timed at every size up to 16 (cost_model.cost_sizes), not interpolated.
    cost_sizes = (*range(1, 17), 24, 32, 64)

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None, n_ctx: int = DEFAULT_CTX,
                 max_leaves: int = DEFAULT_MAX_LEAVES, n_batch: int = 512, lora: str | os.PathLike | None = None,
                 flash_attn: bool = False, repack: bool | None = None):
        ok, why = available()
        if not ok:
            raise RuntimeError(f"{why}; {INSTALL_HINT}")
        L = _lib()
        _init_backend()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        if threads is None:
            from ooospec.runtime.backends.hardware import available_cores

            threads = available_cores()
        self.threads = int(threads)
        self.n_ctx, self.max_leaves, self.n_batch = int(n_ctx), int(max_leaves), int(n_batch)
        if repack is None:
            repack, why = default_repack()
            if not repack:
                logger.info("llama.cpp: %s", why)
        self.repack = bool(repack)
        self._model = _load_model(self.path, self.repack)
        self._ctx = _new_context(self, flash_attn)
        self._mem = L.llama_get_memory(self._ctx)
        self._vocab = L.llama_model_get_vocab(self._model)
        self.vocab_size = int(L.llama_vocab_n_tokens(self._vocab))
        self._batch = L.llama_batch_init(self.n_batch, 0, self.max_leaves)
        self._lora = None if lora is None else _apply_lora(self, lora)
        self.owner: LlamaCppKV | None = None   # the cache whose entries the context holds
        self._tie_margin: float | None = None
        self.shape = GGUFShape.from_metadata(self.metadata())

    # ------------------------------------------------------------------------------------------- facts

    def metadata(self) -> dict[str, str]:
        """The GGUF's key/value metadata as strings (arrays are left out by llama.cpp)."""
        L = _lib()
        out, buf = {}, ctypes.create_string_buffer(4096)
        for i in range(L.llama_model_meta_count(self._model)):
            n = L.llama_model_meta_key_by_index(self._model, i, buf, len(buf))
            key = buf.value.decode("utf-8", errors="replace") if n >= 0 else None
            n = L.llama_model_meta_val_str_by_index(self._model, i, buf, len(buf))
            if key is not None and n >= 0:
                out[key] = buf.value.decode("utf-8", errors="replace")
        return out

    @property
    def weight_type(self) -> str:
        """The model's weight format as llama.cpp describes it, e.g. ``"qwen2 0.5B Q4_K - Medium"``."""
        buf = ctypes.create_string_buffer(256)
        _lib().llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", errors="replace")

    def eos_token_ids(self) -> list[int]:
        """Every end-of-generation token of the GGUF's vocabulary (EOS, EOT, ``<|im_end|>``, ...)."""
        L = _lib()
        return sorted(t for t in range(self.vocab_size) if L.llama_vocab_is_eog(self._vocab, t))

    def cost_fingerprint(self) -> str:
        """What the forward cost depends on: file name, size, weight format and threads, and the CPU."""
        from ooospec.runtime.backends.hardware import cpu_info

        h = hashlib.sha256(str(self.path.stat().st_size).encode())
        with open(self.path, "rb") as f:   # head and tail of the file: metadata and the last tensors' bytes
            h.update(f.read(1 << 20))
            f.seek(max(self.path.stat().st_size - (1 << 20), 0))
            h.update(f.read(1 << 20))
        digest = h.hexdigest()[:12]
        info = cpu_info()
        return (f"{BACKEND}|{self.path.name}|{self.weight_type}|file={digest}|threads={self.threads}"
                f"|{info['model']}|{','.join(info['flags'])}" + ("" if self.repack else "|no-repack"))

    def footprint(self) -> Footprint:
        """:class:`~ooospec.runtime.backends.cost_model.Footprint` from the GGUF's tensor table (bytes as stored:
        quantized)."""
        from ooospec.runtime.backends.cost_model import Footprint
        from ooospec.runtime.backends.gguf_table import tensor_table

        tensors = {t.name: (t.n_elements, t.n_bytes, t.n_dims) for t in tensor_table(self.path).values()}
        embed = tensors.get("token_embd.weight", (0, 0, 2))
        tied = "output.weight" not in tensors
        head = embed if tied else tensors["output.weight"]
        matrices = sum(n for n, _, dims in tensors.values() if dims >= 2)
        body = matrices - head[0] - (0 if tied else embed[0])
        weight_bytes = sum(b for _, b, _ in tensors.values()) - (0 if tied else embed[1])
        shape = self.shape
        return Footprint(body, head[0], weight_bytes, shape.kv_bytes_per_token, shape.num_layers,
                         shape.num_heads * shape.head_dim)

    @property
    def tie_margin(self) -> float:
        """The engine's tie margin on this file and machine: at least :data:`TIE_MARGIN`, and at least twice the
        batch-shape difference :func:`batch_shape_diff` measures here (once per file, threads and CPU; cached)."""
        if self._tie_margin is None:
            self._tie_margin = max(TIE_MARGIN, TIE_FACTOR * cached_batch_shape_diff(self))
        return self._tie_margin

    def new_kv_cache(self, persistent: bool = False) -> LlamaCppKV:
        """A cache of one sequence; ``persistent``: parked (copied out) when another cache takes the context, and
        copied back on its next use (a session's; see :mod:`~ooospec.runtime.backends.llamacpp_kv`)."""
        return LlamaCppKV(self, persistent=persistent)

    # --------------------------------------------------------- the cache's primitives (runtime/backends/llamacpp_kv.py)

    def decode(self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[Sequence[int]],
               outputs: Sequence[bool]) -> None:
        """One ``llama_decode`` of ``tokens`` at ``positions``; token ``i`` joins sequences ``seq_ids[i]`` and
        keeps its logits where ``outputs[i]``."""
        L, b = _lib(), self._batch
        n = len(tokens)
        if n > self.n_batch:
            raise ValueError(f"a batch of {n} tokens exceeds n_batch={self.n_batch}")
        for i in range(n):
            b.token[i] = tokens[i]
            b.pos[i] = positions[i]
            ids = seq_ids[i]
            b.n_seq_id[i] = len(ids)
            row = b.seq_id[i]
            for j, s in enumerate(ids):
                row[j] = s
            b.logits[i] = outputs[i]
        b.n_tokens = n
        rc = L.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode failed with code {rc} on a batch of {n} tokens "
                               f"(positions {positions[0]}..{max(positions)}; n_ctx={self.n_ctx})")

    def logits(self, n_out: int) -> torch.Tensor:
        """The logits ``[n_out, vocab]`` (float32) of the last decode's output tokens, copied."""
        ptr = _lib().llama_get_logits(self._ctx)
        arr = np.ctypeslib.as_array(ptr, shape=(n_out * self.vocab_size,))
        return torch.from_numpy(arr.reshape(n_out, self.vocab_size).copy())

    def seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        _lib().llama_memory_seq_rm(self._mem, seq, p0, p1)

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        _lib().llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def clear(self) -> None:
        _lib().llama_memory_clear(self._mem, True)

    def seq_state(self, seq: int) -> ctypes.Array:
        """The cells of sequence ``seq`` (positions, K, V) as one byte buffer (``llama_state_seq_get_data``)."""
        L = _lib()
        size = L.llama_state_seq_get_size(self._ctx, seq)
        buf = (ctypes.c_ubyte * size)()
        if L.llama_state_seq_get_data(self._ctx, buf, size, seq) != size:
            raise RuntimeError(f"llama.cpp could not copy the KV cells of sequence {seq} ({size} bytes)")
        return buf

    def set_seq_state(self, buf: ctypes.Array, seq: int) -> None:
        """Put :meth:`seq_state`'s cells back as sequence ``seq`` (into free cells of the context)."""
        if _lib().llama_state_seq_set_data(self._ctx, buf, len(buf), seq) != len(buf):
            raise RuntimeError(f"llama.cpp could not restore {len(buf)} bytes of KV cells (n_ctx={self.n_ctx})")

    def close(self) -> None:
        L = _lib()
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_lora", None):
            self._lora = None   # freed with the model
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):
        with contextlib.suppress(Exception):   # interpreter shutdown: the library may be gone
            self.close()


# --------------------------------------------------------------------------------------- batch-shape numerics


@dataclass(frozen=True)
class BatchShapeDiff:
    """The same tokens' logits scored in one forward vs one token at a time (same cache, same positions)."""

    max_abs_logit_diff: float    # the largest absolute logit difference
    argmax_differs: bool         # some token's argmax differs between the two


def batch_shape_diff(target: LlamaCppTarget, context: int = 256, chain: int = 16, seed: int = 0) -> BatchShapeDiff:
    """``chain`` tokens scored in one forward vs the same tokens scored one at a time, on a random ``context``-token
    prompt (the chain is the model's own greedy continuation).

    llama.cpp's batched kernels accumulate in another order than its one-token dot products, so the difference is
    not 0; the engine's tie margin has to cover it (a choice closer than that is re-taken by a one-token forward).
    """
    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(100, min(target.vocab_size, 32000), size=context)]
    kv = target.new_kv_cache()
    kv.reset()
    kv.prefill(prompt[:-1])
    tokens = [prompt[-1]]
    for _ in range(chain - 1):            # greedy continuation, one token at a time
        logits = kv.forward_tree(chain_tree([tokens[-1]]))
        kv.commit([0])
        tokens.append(int(logits[0].argmax()))
    kv.truncate(len(prompt) - 1)
    singles = []
    for tok in tokens:
        singles.append(kv.forward_tree(chain_tree([tok]))[0].clone())
        kv.commit([0])
    kv.truncate(len(prompt) - 1)
    batched = kv.forward_tree(chain_tree(tokens)).clone()
    kv.commit([])
    single = torch.stack(singles)
    return BatchShapeDiff(float((batched - single).abs().max()), bool((batched.argmax(-1) != single.argmax(-1)).any()))


TIE_FACTOR = 2.0   # a top-2 margin moves by up to twice the largest logit difference
_NUMERICS: dict[str, float] = {}


def cached_batch_shape_diff(target: LlamaCppTarget) -> float:
    """:func:`batch_shape_diff`'s largest logit difference for this file, threads and CPU: from memory, from
    ``$OOOSPEC_CACHE/hardware.json`` (section ``llamacpp_batch_shape_diff``) or measured (a second or two)."""
    from ooospec.runtime.backends.hardware import cached_probe

    key = target.cost_fingerprint()
    if key not in _NUMERICS:
        t0 = time.perf_counter()
        _NUMERICS[key] = cached_probe("llamacpp_batch_shape_diff", key,
                                      lambda: batch_shape_diff(target).max_abs_logit_diff)
        logger.info("llama.cpp batch-shape difference of %s: %.3f (%.1fs)", target.path.name, _NUMERICS[key],
                    time.perf_counter() - t0)
    return _NUMERICS[key]


# --------------------------------------------------------------------------------------- plain greedy reference


def greedy_reference(target: LlamaCppTarget, prompt: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int], stop=None) -> tuple[list[int], float, float]:
    """llama.cpp's plain greedy decoding the way its examples run it: the whole prompt in one batch (logits of
    the last token), then one token per ``llama_decode``; argmax in C++ order (``np.argmax``, first maximum).

    Returns ``(tokens, prefill_s, decode_s)``. The reference ``tests/runtime/backends/test_llamacpp.py`` holds the
    engine to.
    """
    L = _lib()
    target.owner = None
    target.clear()
    eos = {int(t) for t in eos_token_ids}
    prompt = [int(t) for t in prompt]
    t0 = time.perf_counter()
    step = target.n_batch
    for start in range(0, len(prompt), step):
        chunk = prompt[start:start + step]
        last = start + len(chunk) == len(prompt)
        target.decode(chunk, range(start, start + len(chunk)), [[0]] * len(chunk),
                      [False] * (len(chunk) - 1) + [last])
    t1 = time.perf_counter()
    out: list[int] = []
    pos = len(prompt)
    while True:
        ptr = L.llama_get_logits_ith(target._ctx, -1)
        tok = int(np.argmax(np.ctypeslib.as_array(ptr, shape=(target.vocab_size,))))
        out.append(tok)
        if tok in eos or len(out) >= max_new_tokens or (stop is not None and stop(out)):
            break
        target.decode([tok], [pos], [[0]], [True])
        pos += 1
    return out, t1 - t0, time.perf_counter() - t1
