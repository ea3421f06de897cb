"""The llama.cpp backend: a GGUF target on llama.cpp's CPU kernels, verified as draft trees by the same engine.

The tree engine (:mod:`ooospec.runtime.engine`) needs one thing from a backend: a KV cache owner with
``prefill``, ``forward_tree`` (one forward over a token tree on top of the cache, logits for every node) and
``commit`` (keep the accepted root path). :class:`LlamaCppKV` gives exactly that on llama.cpp, through its
Python bindings (``llama-cpp-python``, low-level API), so the engine's drafters, budget policy and greedy
acceptance run unchanged on quantized weights::

    target = LlamaCppTarget("qwen2.5-coder-0.5b.gguf", threads=2)     # or load_target(name, backend="llama.cpp")
    engine = SpecEngine(target, drafters, eos_token_ids=target.eos_token_ids())
    engine.generate(prompt_ids, 256)

How a tree becomes one llama.cpp batch (the scheme of llama.cpp's own tree-speculative example): every leaf of
the tree is a sequence id; a node carries the ids of all leaves below it, so its KV cell belongs to every
root-to-leaf path through it. llama.cpp masks a query by its *first* sequence id and position: node ``i`` (first
id = a leaf ``s`` below it) sees the cells of ``s`` at positions ``<= pos(i)``: the committed prefix and exactly
``i``'s ancestors. The KV cache is *unified* (one buffer; a cell holds a set of sequence ids), so a cell shared
by several paths is stored once.

Invariant between steps: the committed cells (prompt + accepted tokens but the last) belong to sequences
``0 .. n_seq - 1`` (``n_seq`` grows to the widest tree seen, up to ``max_leaves``). After a forward, ``commit``
keeps the accepted path: the path's cells are exactly the cells of a leaf ``s`` below its last node at
positions ``< length + len(path)``; every other sequence drops the tree's cells (``llama_memory_seq_rm``) and
gets the path back (``llama_memory_seq_cp``, which adds a sequence id to existing cells: no KV is copied).

Numerics. llama.cpp's CPU matmuls pick kernels by batch size (a one-token forward runs matrix-vector dots; a
batch may run repacked or tiled matrix-matrix kernels with another accumulation order), so a token scored inside
a 16-node tree can get logits that differ in the last bits from the same token scored alone. The engine's
exactness contract is "greedy output of the same backend": acceptance stops before any choice whose top-2 margin
is below the target's ``tie_margin`` and takes that token from a one-token forward, like the bf16 HF path. The
margin is measured per file and machine (:func:`batch_shape_diff`, twice the largest logit difference between a
16-token forward and one-token forwards, at least :data:`TIE_MARGIN`): 0.30 -> 0.6 on the registry's 0.5B Qwen
GGUF, 0.68 -> 1.36 on the 1.5B one (``python -m ooospec.eval.substrate``, EPYC Zen 4, 2 threads).

One context per target. A llama.cpp context holds one physical KV store, so only one :class:`LlamaCppKV` of a
target can hold entries at a time: a cache used after another one took the context finds itself empty (its
tokens are dropped and re-prefilled by the engine's ``keep_prefix_of``), which costs time, never correctness.
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ooospec.runtime.kv_cache import common_prefix_len
from ooospec.runtime.tree import DraftTree

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


@dataclass
class _TextConfig:
    """The few config fields the runtime reads from a target (HF ``PretrainedConfig`` look-alike)."""

    vocab_size: int
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    _name_or_path: str
    _attn_implementation: str = BACKEND
    extra: dict = field(default_factory=dict)

    def get_text_config(self):
        return self

    def to_json_string(self, use_diff: bool = False) -> str:
        import json

        return json.dumps({k: v for k, v in vars(self).items() if k != "extra"}, sort_keys=True)


@dataclass
class _GenerationConfig:
    eos_token_id: list[int]


class LlamaCppTarget:
    """A GGUF model and one llama.cpp context (batch 1, unified KV, up to ``max_leaves`` tree leaves).

    Args:
        path: the ``.gguf`` file.
        threads: llama.cpp threads for decoding and batches (None: the cores this process may use).
        n_ctx: context length (prompt + output + the widest tree).
        max_leaves: most root-to-leaf paths a verified tree may have (sequence ids of the context).
        n_batch: the largest batch one ``llama_decode`` takes (prefills are split into chunks of it).
        lora: optional GGUF LoRA adapter applied with scale 1.
        flash_attn: llama.cpp's flash attention (off by default: see the note in ``__init__``).
        repack: let llama.cpp repack weights at load for its batched CPU kernels (its default).
    """

    backend = BACKEND
    device = torch.device("cpu")
    dtype = torch.float32   # the logits' dtype (weights are whatever the GGUF holds, see ``weight_type``)

    def __init__(self, path: str | os.PathLike, *, threads: int | None = None, n_ctx: int = DEFAULT_CTX,
                 max_leaves: int = DEFAULT_MAX_LEAVES, n_batch: int = 512, lora: str | os.PathLike | None = None,
                 flash_attn: bool = False, repack: bool = True):
        ok, why = available()
        if not ok:
            raise RuntimeError(f"{why}; {INSTALL_HINT}")
        L = _lib()
        _init_backend()
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such GGUF file")
        if threads is None:
            from ooospec.runtime.hardware import available_cores

            threads = available_cores()
        self.threads = int(threads)
        self.n_ctx, self.max_leaves, self.n_batch = int(n_ctx), int(max_leaves), int(n_batch)
        mparams = L.llama_model_default_params()
        mparams.progress_callback = _NO_PROGRESS   # llama.cpp prints a dot per loaded chunk otherwise
        mparams.use_extra_bufts = bool(repack)
        self._model = L.llama_model_load_from_file(str(self.path).encode(), mparams)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {self.path}")
        cparams = L.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = self.max_leaves
        cparams.n_threads = cparams.n_threads_batch = self.threads
        cparams.kv_unified = True     # a cell shared by several tree paths is one cell with several sequence ids
        # Flash attention on the CPU accumulates V in fp16 in the cells' physical order, and a tree's accepted path
        # need not sit in positional order (rejected siblings leave holes): the same context would give
        # order-dependent logits (0.03 on a tiny Q4_0 model). The plain path accumulates in fp32.
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.no_perf = True
        self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            raise RuntimeError(f"llama.cpp could not create a context for {self.path} (n_ctx={self.n_ctx})")
        self._mem = L.llama_get_memory(self._ctx)
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self._batch = L.llama_batch_init(self.n_batch, 0, self.max_leaves)
        self._lora = None
        if lora is not None:
            self._lora = L.llama_adapter_lora_init(self._model, str(lora).encode())
            if not self._lora:
                raise RuntimeError(f"llama.cpp could not load the LoRA adapter {lora}")
            adapters = (L.llama_adapter_lora_p_ctypes * 1)(self._lora)
            scales = (ctypes.c_float * 1)(1.0)
            L.llama_set_adapters_lora(self._ctx, adapters, 1, scales)
        self.owner: LlamaCppKV | None = None   # the cache whose entries the context holds
        self._tie_margin: float | None = None
        meta = self.metadata()
        arch = meta.get("general.architecture", "?")

        def num(key: str, default: int = 0) -> int:
            try:
                return int(meta.get(f"{arch}.{key}", default))
            except ValueError:
                return default

        heads = num("attention.head_count", 1)
        self.config = _TextConfig(
            vocab_size=self.n_vocab, num_hidden_layers=num("block_count"), hidden_size=num("embedding_length"),
            num_attention_heads=heads, num_key_value_heads=num("attention.head_count_kv", heads),
            _name_or_path=str(self.path), extra={"architecture": arch, "file_type": self.weight_type})
        self.generation_config = _GenerationConfig(self.eog_token_ids())
        self.name_or_path = str(self.path)

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

    @property
    def size_bytes(self) -> int:
        return int(_lib().llama_model_size(self._model))

    @property
    def n_params(self) -> int:
        return int(_lib().llama_model_n_params(self._model))

    def eog_token_ids(self) -> list[int]:
        """Every end-of-generation token of the GGUF's vocabulary (EOS, EOT, ``<|im_end|>``, ...)."""
        L = _lib()
        return sorted(t for t in range(self.n_vocab) if L.llama_vocab_is_eog(self._vocab, t))

    def fingerprint(self) -> str:
        """What the forward cost depends on besides the machine: file name, size, weight format, threads."""
        h = hashlib.sha256(str(self.path.stat().st_size).encode())
        with open(self.path, "rb") as f:   # head and tail of the file: metadata and the last tensors' bytes
            h.update(f.read(1 << 20))
            f.seek(max(self.path.stat().st_size - (1 << 20), 0))
            h.update(f.read(1 << 20))
        digest = h.hexdigest()[:12]
        return f"{BACKEND}|{self.path.name}|{self.weight_type}|file={digest}|threads={self.threads}"

    def footprint(self):
        """:class:`~ooospec.runtime.cost_model.Footprint` from the GGUF's tensor table (bytes as stored: quantized)."""
        from gguf import GGUFReader

        from ooospec.runtime.cost_model import Footprint

        tensors = {t.name: (int(t.n_elements), int(t.n_bytes), len(t.shape)) for t in GGUFReader(self.path).tensors}
        embed = tensors.get("token_embd.weight", (0, 0, 2))
        tied = "output.weight" not in tensors
        head = embed if tied else tensors["output.weight"]
        matrices = sum(n for n, _, dims in tensors.values() if dims >= 2)
        body = matrices - head[0] - (0 if tied else embed[0])
        weight_bytes = sum(b for _, b, _ in tensors.values()) - (0 if tied else embed[1])
        cfg = self.config
        head_dim = cfg.hidden_size // max(cfg.num_attention_heads, 1)
        kv_bytes = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2   # f16 K and V cells
        return Footprint(body, head[0], weight_bytes, kv_bytes, cfg.num_hidden_layers,
                         cfg.num_attention_heads * head_dim)

    @property
    def tie_margin(self) -> float:
        """The engine's tie margin on this file and machine: at least :data:`TIE_MARGIN`, and at least twice the
        batch-shape difference :func:`batch_shape_diff` measures here (once per file, threads and CPU; cached)."""
        if self._tie_margin is None:
            self._tie_margin = max(TIE_MARGIN, TIE_FACTOR * cached_batch_shape_diff(self))
        return self._tie_margin

    def new_kv_cache(self) -> LlamaCppKV:
        return LlamaCppKV(self)

    # ------------------------------------------------------------------------------------------- decode

    def _decode(self, tokens: Sequence[int], positions: Sequence[int], seq_ids: Sequence[Sequence[int]],
                outputs: Sequence[bool]) -> None:
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

    def _logits(self, n_out: int) -> torch.Tensor:
        ptr = _lib().llama_get_logits(self._ctx)
        arr = np.ctypeslib.as_array(ptr, shape=(n_out * self.n_vocab,))
        return torch.from_numpy(arr.reshape(n_out, self.n_vocab).copy())

    def _seq_rm(self, seq: int, p0: int, p1: int = -1) -> None:
        _lib().llama_memory_seq_rm(self._mem, seq, p0, p1)

    def _seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        _lib().llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def _clear(self) -> None:
        _lib().llama_memory_clear(self._mem, True)

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


def _leaf_seqs(tree: DraftTree) -> tuple[list[list[int]], int]:
    """Sequence ids per node: the index of every leaf below it (its own if it is a leaf), and the leaf count.

    Worked example: ``root -> a -> {b, c}``, ``root -> d`` (nodes 0..4 = root, a, b, c, d): leaves b, c, d get ids
    0, 1, 2; node a carries [0, 1], the root [0, 1, 2]. A node's first id is the leaf its query is masked by.
    """
    n = tree.num_nodes
    has_child = [False] * n
    for i in range(1, n):
        has_child[tree.parents[i]] = True
    seqs: list[list[int]] = [[] for _ in range(n)]
    leaf = 0
    for i in range(n):
        if not has_child[i]:
            node = i
            while node >= 0:
                seqs[node].append(leaf)
                node = tree.parents[node]
            leaf += 1
    return seqs, leaf


class LlamaCppKV:
    """The KV cache of one sequence on a :class:`LlamaCppTarget` (the interface of
    :class:`~ooospec.runtime.kv_cache.KVCache` the engine and sessions use). See the module docstring."""

    def __init__(self, model: LlamaCppTarget):
        self.model = model
        self.length = 0
        self.pending = 0
        self.tokens: list[int] = []
        self._pending_tokens: list[int] = []
        self._pending_seqs: list[list[int]] = []
        self._n_seq = 1   # sequences 0..n_seq-1 hold the committed cells

    @property
    def device(self) -> torch.device:
        return self.model.device

    def _own(self) -> None:
        """Take the context: if another cache used it since, this cache's entries are gone; start empty."""
        if self.model.owner is not self:
            self.model._clear()
            self.model.owner = self
            self.length = self.pending = 0
            self.tokens, self._pending_tokens, self._pending_seqs = [], [], []
            self._n_seq = 1

    def _require_committed(self, what: str) -> None:
        if self.pending:
            raise RuntimeError(f"{what}() called with an uncommitted forward; call commit() first")

    def reset(self) -> None:
        self._own()
        self.model._clear()
        self.length = self.pending = 0
        self.tokens, self._pending_tokens, self._pending_seqs = [], [], []
        self._n_seq = 1

    @property
    def nbytes(self) -> int:
        cfg = self.model.config
        head_dim = cfg.hidden_size // max(cfg.num_attention_heads, 1)
        return 2 * 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * self.length   # f16 K and V

    def truncate(self, length: int) -> None:
        self._own()
        self._require_committed("truncate")
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of {self.length} entries to {length}")
        if length == self.length:
            return
        for s in range(self._n_seq):
            self.model._seq_rm(s, length, -1)
        self.length = length
        del self.tokens[length:]

    def keep_prefix_of(self, tokens: Sequence[int]) -> int:
        self._own()
        kept = common_prefix_len(self.tokens, tokens)
        self.truncate(kept)
        return kept

    def snapshot(self, length: int | None = None):
        raise NotImplementedError("KV snapshots are not implemented on the llama.cpp backend (use backend 'hf')")

    def load(self, snap) -> None:
        raise NotImplementedError("KV snapshots are not implemented on the llama.cpp backend (use backend 'hf')")

    def prefill(self, tokens: Sequence[int]) -> None:
        """Append committed tokens in chunks of ``n_batch`` (no logits are computed)."""
        self._own()
        self._require_committed("prefill")
        tokens = [int(t) for t in tokens]
        if self.length + len(tokens) + 1 > self.model.n_ctx:
            raise ValueError(f"prompt of {self.length + len(tokens) + 1} tokens does not fit n_ctx={self.model.n_ctx}")
        seqs = list(range(self._n_seq))
        step = self.model.n_batch
        for start in range(0, len(tokens), step):
            chunk = tokens[start:start + step]
            pos = range(self.length, self.length + len(chunk))
            self.model._decode(chunk, pos, [seqs] * len(chunk), [False] * len(chunk))
            self.length += len(chunk)
            self.tokens.extend(chunk)

    def forward_tree(self, tree: DraftTree) -> torch.Tensor:
        """Logits ``[N, vocab]`` (float32) of every tree node on top of the cache; entries pending until commit."""
        self._own()
        if self.pending:
            raise RuntimeError("forward_tree() called twice without commit()")
        seqs, n_leaves = _leaf_seqs(tree)
        if n_leaves > self.model.max_leaves:
            raise ValueError(f"a tree with {n_leaves} leaves exceeds max_leaves={self.model.max_leaves}")
        if self.length + tree.max_depth + 1 > self.model.n_ctx:
            raise ValueError(f"context full: {self.length} cached + a tree of depth {tree.max_depth} > "
                             f"n_ctx={self.model.n_ctx}")
        for s in range(self._n_seq, n_leaves):   # every path needs the committed prefix
            self.model._seq_cp(0, s)
        self._n_seq = max(self._n_seq, n_leaves)
        positions = [self.length + d for d in tree.depths]
        self.model._decode(list(tree.tokens), positions, seqs, [True] * tree.num_nodes)
        self.pending = tree.num_nodes
        self._pending_tokens = list(tree.tokens)
        self._pending_seqs = seqs
        return self.model._logits(tree.num_nodes)

    def commit(self, kept_nodes: Sequence[int]) -> None:
        """Keep the pending cells of ``kept_nodes`` (a root path, in order) in every sequence; drop the rest."""
        if self.model.owner is not self:
            raise RuntimeError("commit() on a cache whose context was taken by another cache")
        kept = list(kept_nodes)
        if len(kept) > self.pending:
            raise ValueError(f"cannot keep {len(kept)} nodes from a forward of {self.pending}")
        start, end = self.length, self.length + len(kept)
        tree_seqs = sorted({s for ids in self._pending_seqs for s in ids})
        if not kept:
            for s in tree_seqs:
                self.model._seq_rm(s, start, -1)
        else:
            keep_seq = self._pending_seqs[kept[-1]][0]   # a leaf below the last kept node: its path is `kept`
            for s in tree_seqs:
                if s != keep_seq:
                    self.model._seq_rm(s, start, -1)
            self.model._seq_rm(keep_seq, end, -1)
            for s in range(self._n_seq):
                if s != keep_seq:
                    self.model._seq_cp(keep_seq, s, start, end)
        self.tokens.extend(self._pending_tokens[i] for i in kept)
        self.length, self.pending = end, 0
        self._pending_tokens, self._pending_seqs = [], []


# --------------------------------------------------------------------------------------- batch-shape numerics


def batch_shape_diff(target: LlamaCppTarget, context: int = 256, chain: int = 16, seed: int = 0) -> float:
    """The largest absolute logit difference between ``chain`` tokens scored in one forward and the same tokens
    scored one at a time, on a random ``context``-token prompt (the chain is the model's own greedy continuation).

    llama.cpp's batched kernels accumulate in another order than its one-token dot products, so this is not 0;
    the engine's tie margin has to cover it (a choice closer than that is re-taken by a one-token forward).
    """
    from ooospec.runtime.tree import chain_tree

    rng = np.random.default_rng(seed)
    prompt = [int(t) for t in rng.integers(100, min(target.n_vocab, 32000), size=context)]
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
    return float((batched - torch.stack(singles)).abs().max())


TIE_FACTOR = 2.0   # a top-2 margin moves by up to twice the largest logit difference
_NUMERICS: dict[str, float] = {}


def cached_batch_shape_diff(target: LlamaCppTarget) -> float:
    """:func:`batch_shape_diff` for this file, threads and CPU: from memory, from ``$OOOSPEC_CACHE/hardware.json``
    (section ``llamacpp_batch_shape_diff``) or measured (a second or two)."""
    from ooospec.runtime.hardware import cached_probe, cpu_info

    info = cpu_info()
    key = f"{target.fingerprint()}|{info['model']}|{','.join(info['flags'])}"
    if key not in _NUMERICS:
        t0 = time.perf_counter()
        _NUMERICS[key] = cached_probe("llamacpp_batch_shape_diff", key, lambda: batch_shape_diff(target))
        logger.info("llama.cpp batch-shape difference of %s: %.3f (%.1fs)", target.path.name, _NUMERICS[key],
                    time.perf_counter() - t0)
    return _NUMERICS[key]


# --------------------------------------------------------------------------------------- plain greedy peer


def greedy_reference(target: LlamaCppTarget, prompt: Sequence[int], max_new_tokens: int,
                     eos_token_ids: Sequence[int], stop=None) -> tuple[list[int], float, float]:
    """llama.cpp's plain greedy decoding the way its examples run it: the whole prompt in one batch (logits of
    the last token), then one token per ``llama_decode``; argmax in C++ order (``np.argmax``, first maximum).

    Returns ``(tokens, prefill_s, decode_s)``. Used by the bench's ``llama.cpp`` peer method.
    """
    L = _lib()
    target.owner = None
    target._clear()
    eos = {int(t) for t in eos_token_ids}
    prompt = [int(t) for t in prompt]
    t0 = time.perf_counter()
    step = target.n_batch
    for start in range(0, len(prompt), step):
        chunk = prompt[start:start + step]
        last = start + len(chunk) == len(prompt)
        target._decode(chunk, range(start, start + len(chunk)), [[0]] * len(chunk),
                       [False] * (len(chunk) - 1) + [last])
    t1 = time.perf_counter()
    out: list[int] = []
    pos = len(prompt)
    n_vocab = target.n_vocab
    while True:
        ptr = L.llama_get_logits_ith(target._ctx, -1)
        tok = int(np.argmax(np.ctypeslib.as_array(ptr, shape=(n_vocab,))))
        out.append(tok)
        if tok in eos or len(out) >= max_new_tokens or (stop is not None and stop(out)):
            break
        target._decode([tok], [pos], [[0]], [True])
        pos += 1
    return out, t1 - t0, time.perf_counter() - t1
