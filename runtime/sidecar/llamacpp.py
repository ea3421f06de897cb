"""The sidecar on llama.cpp: its LoRA as a GGUF adapter on the registry's base GGUF, and waves as sequences.

The transformers sidecar (:mod:`ooospec.runtime.sidecar.wave`) trains and serves on the base model dequantized from the
registry's GGUF. Here the same base runs on llama.cpp's CPU kernels, from that same GGUF file (the weights the
adapter was trained on, quantized as shipped), with the PEFT adapter converted once into a llama.cpp LoRA GGUF
(:func:`lora_to_gguf`: every ``lora_A``/``lora_B`` pair under its GGUF tensor name, ``adapter.lora.alpha`` so that
llama.cpp scales it by ``alpha / r`` as PEFT does). The adapter is applied at run time, not merged: merging and
requantizing to the base's 4-5 bit types would bury the low-rank delta in the quantization step.

A wave (one shared block, N short queries) is answered the way llama.cpp's parallel example decodes: the block's
KV lives in sequence 0 and stays there after the wave, so the next wave prefills only what its block does not share
with it (a tools-first block: the conversation, once the toolbox has been seen); the queries go in as one token
tree (shared prefixes once), each distinct query ending in a sequence of its own, and every branch then decodes
greedily, all live branches in one ``llama_decode`` per step (a branch may carry a chain of drafts from
:class:`~ooospec.runtime.sidecar.wave.AnswerDrafter`, kept as far as greedy decoding agrees). Answers are greedy
decoding of ``block + query`` on this backend; llama.cpp's batched kernels round differently from its one-token
ones, so an answer can differ from a lone decode at a near-tie, and from the transformers sidecar where bf16 and
the GGUF's kernels disagree (measured: ``eval/reports/sidecar/engines/``).

    sidecar = LlamaCppSidecar.from_adapter("adapters/sidecar", threads=2)   # or engines.load_sidecar(engine=...)
    call, result = sidecar.predict(messages, tools)
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ooospec.runtime.sidecar.lora import lora_alpha, lora_pairs
from ooospec.runtime.sidecar.wave import (
    Propose,
    Sidecar,
    WaveCancelled,
    check_wave_args,
    measure_wave_cost,
    top_logprobs,
)
from ooospec.runtime.tokens import common_prefix_len
from ooospec.runtime.tree import DraftTree, build_tree

logger = logging.getLogger(__name__)

ENGINE = "llama.cpp"
DEFAULT_CTX = 16384         # KV cells: the block, the query tree and every branch's answer (~12 KB each, 0.5B)
DEFAULT_SEQS = 64           # llama.cpp sequences: 0 holds the block, the rest one branch each (more: passes)
LORA_FILE = "sidecar-lora.gguf"


# ------------------------------------------------------------------------------------------ the adapter


ARCHS = frozenset({"llama", "qwen2", "qwen3", "gemma3"})   # GGUF architectures the conversion was checked on
PERMUTED_QK = frozenset({"llama"})   # llama.cpp's converter reorders these q/k rows for its rope: so must B's


def permute_rows(weight, heads: int):
    """llama.cpp's q/k row order for a Llama GGUF (its ``convert_hf_to_gguf.py`` ``permute``): within each head,
    the rotary halves interleaved. ``W = B @ A`` changes rows with ``B``, so the LoRA's ``B`` takes the same
    permutation as the base weight did."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def lora_to_gguf(adapter_dir: str | os.PathLike, base_gguf: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Write the PEFT LoRA in ``adapter_dir`` as a llama.cpp LoRA GGUF for ``base_gguf`` (float32), atomically.

    Tensor names come from gguf's map for the base's architecture (``model.layers.3.mlp.down_proj`` ->
    ``blk.3.ffn_down.weight.lora_a`` / ``.lora_b``); PEFT's ``lora_A`` ``[r, in]`` and ``lora_B`` ``[out, r]`` are
    stored as they are, the shapes llama.cpp checks against the base tensor. Raises ValueError naming the first
    module without a GGUF name, an unpaired A/B, or an unsupported adapter option.
    """
    import gguf

    adapter_dir, out = Path(adapter_dir), Path(out)
    lora, config = lora_pairs(adapter_dir)
    alpha = lora_alpha(config)
    reader = gguf.GGUFReader(str(base_gguf))
    arch_name = _field_str(reader, "general.architecture")
    arch = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}.get(arch_name)
    if arch is None:
        raise ValueError(f"{base_gguf}: architecture {arch_name!r} unknown to gguf")
    if arch_name not in ARCHS:
        raise ValueError(f"{base_gguf}: architecture {arch_name!r}; the LoRA conversion knows {sorted(ARCHS)}")
    names = gguf.get_tensor_name_map(arch, int(_field_num(reader, f"{arch_name}.block_count")))
    heads = int(_field_num(reader, f"{arch_name}.attention.head_count"))
    kv_heads = int(_field_num(reader, f"{arch_name}.attention.head_count_kv"))
    base_tensors = {t.name for t in reader.tensors}
    pairs: dict[str, dict[str, object]] = {}
    for module in sorted(lora):
        name = names.get_name(module + ".weight", try_suffixes=(".weight",))
        if name is None or name not in base_tensors:
            raise ValueError(f"{adapter_dir}: module {module!r} has no tensor in {Path(base_gguf).name}")
        pairs[name] = {ab: w.float().numpy() for ab, w in lora[module].items()}   # bf16 adapters too
    tmp = out.with_name(out.name + ".partial")
    out.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(tmp), arch_name)
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    for name in sorted(pairs):
        writer.add_tensor(name + ".lora_a", pairs[name]["a"])
        lora_b = pairs[name]["b"]
        if arch_name in PERMUTED_QK and name.endswith(("attn_q.weight", "attn_k.weight")):
            lora_b = permute_rows(lora_b, heads if name.endswith("attn_q.weight") else kv_heads)
        writer.add_tensor(name + ".lora_b", lora_b)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(out)
    return out


def _field(reader, key: str):
    f = reader.fields.get(key)
    if f is None:
        raise ValueError(f"GGUF has no {key}")
    return f


def _field_str(reader, key: str) -> str:
    f = _field(reader, key)
    return bytes(f.parts[f.data[0]]).decode()


def _field_num(reader, key: str) -> float:
    f = _field(reader, key)
    return f.parts[f.data[0]][0]


def adapter_gguf(adapter_dir: str | os.PathLike, base_gguf: str | os.PathLike,
                 cache: str | os.PathLike | None = None) -> Path:
    """The adapter's LoRA GGUF: ``adapter_dir/sidecar-lora.gguf`` when an export shipped one, else converted once
    into ``$OOOSPEC_CACHE/sidecar-gguf/<sha of the adapter and base>.gguf``."""
    from ooospec.runtime.paths import cache_dir

    adapter_dir = Path(adapter_dir)
    shipped = adapter_dir / LORA_FILE
    if shipped.is_file():
        return shipped
    h = hashlib.sha256(Path(base_gguf).name.encode())
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        h.update((adapter_dir / name).read_bytes())
    out = cache_dir(cache) / "sidecar-gguf" / f"{h.hexdigest()[:16]}.gguf"
    if not out.is_file():
        logger.info("converting the LoRA of %s to a llama.cpp adapter GGUF (one-off): %s", adapter_dir, out)
        lora_to_gguf(adapter_dir, base_gguf, out)
    return out


# ------------------------------------------------------------------------------------------ waves


@dataclass
class _Branch:
    """One distinct query's answer: its llama.cpp sequence, next position and tokens (``out[-1]`` not fed yet)."""

    query: int
    seq: int
    pos: int
    out: list[int]
    logprobs: list[dict[int, float]] = field(default_factory=list)


def query_seqs(tree: DraftTree, query_ids: Sequence[Sequence[int]], first_seq: int) -> tuple[list[list[int]],
                                                                                          list[int], list[int]]:
    """``(node_seqs, end_of_query, branch_of_query)`` of a query tree (:func:`~ooospec.runtime.tree.build_tree`):
    each distinct query end node is a branch whose sequence is ``first_seq + branch``; a node carries the sequences
    of every branch whose query passes through it (identical queries share a branch).

    Worked example: queries ``[5, 6]``, ``[5, 7]``, ``[5, 6]`` under root ``r``: nodes ``r, 5, 6, 7``; ends 2, 3,
    2; branches 0, 1, 0; with ``first_seq=1`` the seqs are ``[[1, 2], [1, 2], [1], [2]]``.
    """
    node_seqs: list[list[int]] = [[] for _ in range(tree.num_nodes)]
    ends, which, branch_of_end = [], [], {}
    for q in query_ids:
        node = 0
        for tok in q:
            node = tree.children[node][int(tok)]
        if node not in branch_of_end:
            branch_of_end[node] = len(branch_of_end)
            for n in tree.path_to(node):
                node_seqs[n].append(first_seq + branch_of_end[node])
        ends.append(node)
        which.append(branch_of_end[node])
    return node_seqs, ends, which


class LlamaCppWaves:
    """Answers waves on one :class:`~ooospec.runtime.backends.llamacpp.LlamaCppTarget` (see the module docstring); the
    block of the last wave stays in sequence 0 for the next one."""

    def __init__(self, target):
        self.target = target
        self.block: list[int] = []      # tokens whose KV sequence 0 holds

    def forget(self) -> None:
        """Drop the kept block (the next wave prefills all of its block)."""
        self._own()
        self.target.seq_rm(0, -1, -1)
        self.block = []

    def _own(self) -> None:
        if self.target.owner is not self:          # another user of the context cleared it
            self.target.clear()
            self.target.owner = self
            self.block = []

    def prefill(self, tokens: Sequence[int]) -> int:
        """Make sequence 0 hold ``tokens``; returns how many of them were already there (not computed)."""
        self._own()
        tokens = [int(t) for t in tokens]
        keep = common_prefix_len(self.block, tokens)
        self.target.seq_rm(0, keep, -1)
        self.block = self.block[:keep]
        step = self.target.n_batch
        for start in range(keep, len(tokens), step):
            chunk = tokens[start:start + step]
            self.target.decode(chunk, range(start, start + len(chunk)), [[0]] * len(chunk), [False] * len(chunk))
            self.block += chunk
        return keep

    def decode(self, block_ids: Sequence[int], query_ids: Sequence[Sequence[int]], *, max_new_tokens: int,
               eos_token_ids: Sequence[int] = (), should_stop: Callable[[], bool] | None = None,
               propose: Propose | None = None, max_draft_nodes: int = 0,
               logprobs: int = 0) -> tuple[list[list[int]], dict]:
        """Greedy answers of ``block + query_i`` for every i: :func:`~ooospec.runtime.sidecar.wave.decode_branches`'s
        contract and stats, on llama.cpp (``propose``: a chain of drafts per branch, its first candidate)."""
        check_wave_args(block_ids, query_ids, max_new_tokens, max_draft_nodes)
        need = len(block_ids) + sum(len(q) for q in query_ids) + len(query_ids) * (max_new_tokens + max_draft_nodes)
        if need > self.target.n_ctx and len(query_ids) == 1:
            raise ValueError(f"a wave of {need} KV cells does not fit n_ctx={self.target.n_ctx}")
        t0 = time.perf_counter()
        cached = self.prefill(block_ids[:-1])
        t1 = time.perf_counter()
        stats = {"prefill_s": t1 - t0, "decode_s": 0.0, "n_forwards": 0, "block_tokens": len(block_ids),
                 "query_tokens": 0, "drafted": 0, "accepted": 0, "cached_tokens": cached}
        tokens: list[list[int]] = [[] for _ in query_ids]
        lps: list[list[dict[int, float]]] = [[] for _ in query_ids]
        per_pass = self._queries_per_pass(len(block_ids), query_ids, max_new_tokens + max_draft_nodes + 1)
        for start in range(0, len(query_ids), per_pass):
            group = list(query_ids[start:start + per_pass])
            out, lp, st = self._pass(block_ids, group, max_new_tokens, frozenset(int(t) for t in eos_token_ids),
                                     should_stop, propose, max_draft_nodes, logprobs, start)
            tokens[start:start + len(group)], lps[start:start + len(group)] = out, lp
            for k in ("n_forwards", "query_tokens", "drafted", "accepted"):
                stats[k] += st[k]
        stats["decode_s"] = time.perf_counter() - t1
        if logprobs:
            stats["top_logprobs"] = lps
        return tokens, stats

    def _queries_per_pass(self, num_block: int, query_ids: Sequence[Sequence[int]], per_branch: int) -> int:
        free = self.target.n_ctx - num_block - max(len(q) for q in query_ids) * len(query_ids)
        return max(1, min(self.target.max_leaves - 1, free // per_branch, len(query_ids)))

    def _pass(self, block_ids, query_ids, max_new_tokens, eos, should_stop, propose, max_draft_nodes, logprobs,
              offset) -> tuple[list[list[int]], list[list[dict[int, float]]], dict]:
        """One pass of at most ``max_leaves - 1`` queries; its branch sequences are removed afterwards."""
        def poll(when: str) -> None:
            if should_stop is not None and should_stop():
                raise WaveCancelled(f"wave cancelled {when}")

        poll("after the prefill")
        tree = build_tree(int(block_ids[-1]), query_ids, max_nodes=sum(len(q) for q in query_ids))
        node_seqs, ends, which = query_seqs(tree, query_ids, first_seq=1)
        branches: list[_Branch] = []
        try:
            branches = self._query_forward(tree, node_seqs, ends, which, len(block_ids) - 1, logprobs, offset)
            n_forwards, drafted, accepted = 1, 0, 0
            live = [b for b in branches if not _done(b, eos, max_new_tokens)]
            while live:
                poll(f"after {n_forwards} forwards")
                d, a = self._step(live, eos, max_new_tokens, propose, max_draft_nodes, logprobs)
                n_forwards, drafted, accepted = n_forwards + 1, drafted + d, accepted + a
                live = [b for b in live if not _done(b, eos, max_new_tokens)]
        finally:
            for s in range(1, 1 + len(set(ends))):
                self.target.seq_rm(s, -1, -1)
        st = {"n_forwards": n_forwards, "query_tokens": tree.num_nodes - 1, "drafted": drafted, "accepted": accepted}
        return [list(branches[w].out) for w in which], [list(branches[w].logprobs) for w in which], st

    def _query_forward(self, tree, node_seqs, ends, which, root_pos, logprobs, offset) -> list[_Branch]:
        """Feed the query tree (chunks of ``n_batch``, parents first) and start a branch at each distinct end."""
        for s in sorted({s for seqs in node_seqs for s in seqs}):
            self.target.seq_cp(0, s)
        firsts = {}                                      # branch -> its first query
        for q, w in enumerate(which):
            firsts.setdefault(w, q)
        is_end = set(ends)
        rows: dict[int, torch.Tensor] = {}
        step = self.target.n_batch
        for start in range(0, tree.num_nodes, step):
            nodes = range(start, min(start + step, tree.num_nodes))
            self.target.decode([tree.tokens[n] for n in nodes], [root_pos + tree.depths[n] for n in nodes],
                               [node_seqs[n] for n in nodes], [n in is_end for n in nodes])
            outs = [n for n in nodes if n in is_end]
            if outs:
                rows.update(zip(outs, self.target.logits(len(outs))))
        branches = []
        for w in range(len(firsts)):
            end = ends[firsts[w]]
            b = _Branch(offset + firsts[w], 1 + w, root_pos + tree.depths[end] + 1, [])
            _take(b, rows[end], logprobs)
            branches.append(b)
        return branches

    def _step(self, live: Sequence[_Branch], eos, max_new_tokens, propose, max_draft_nodes,
              logprobs) -> tuple[int, int]:
        """One ``llama_decode`` of every live branch's last token and its draft chain; returns (drafted, accepted)."""
        chains = []
        for b in live:
            room = min(max_draft_nodes, max_new_tokens - len(b.out) - 1)
            cands = propose(b.query, b.out) if propose is not None and room > 0 else ()
            chains.append([b.out[-1]] + [int(t) for t in (cands[0] if cands else [])][:room])
        toks, pos, seqs = [], [], []
        for b, chain in zip(live, chains):
            toks += chain
            pos += range(b.pos, b.pos + len(chain))
            seqs += [[b.seq]] * len(chain)
        self.target.decode(toks, pos, seqs, [True] * len(toks))
        logits = self.target.logits(len(toks))
        drafted = accepted = row = 0
        for b, chain in zip(live, chains):
            kept = 0
            for j in range(len(chain)):
                _take(b, logits[row + j], logprobs)
                if _done(b, eos, max_new_tokens) or j + 1 >= len(chain) or b.out[-1] != chain[j + 1]:
                    break
                kept += 1
            drafted, accepted, row = drafted + len(chain) - 1, accepted + kept, row + len(chain)
            b.pos += kept + 1
            self.target.seq_rm(b.seq, b.pos, -1)       # the rejected drafts' cells
        return drafted, accepted


def _take(b: _Branch, row: torch.Tensor, logprobs: int) -> None:
    b.out.append(int(torch.argmax(row)))
    if logprobs:
        b.logprobs.append(top_logprobs(row, logprobs))


def _done(b: _Branch, eos: frozenset[int], max_new_tokens: int) -> bool:
    return b.out[-1] in eos or len(b.out) >= max_new_tokens


# ------------------------------------------------------------------------------------------ the sidecar


class LlamaCppSidecar(Sidecar):
    """A :class:`~ooospec.runtime.sidecar.wave.Sidecar` whose waves run on llama.cpp (``engine = "llama.cpp"``)."""

    engine = ENGINE

    def __init__(self, target, tokenizer, **kwargs):
        super().__init__(target, tokenizer, **kwargs)
        self.waves = LlamaCppWaves(target)

    @classmethod
    def from_adapter(cls, adapter_dir=None, *, threads: int | None = None, dtype: str = "auto",
                     max_new_tokens: int = 48, max_draft_nodes: int = 6, n_ctx: int = DEFAULT_CTX,
                     **_ignored) -> LlamaCppSidecar:
        """The adapter on its base's registry GGUF (``sidecar.json`` ``base``: a registry name or a ``.gguf``).
        ``dtype`` is the GGUF's own (only ``auto`` is accepted)."""
        from transformers import AutoTokenizer

        from ooospec.runtime.backends.llamacpp import LlamaCppTarget
        from ooospec.runtime.backends.models import REGISTRY, gguf_path_of
        from ooospec.runtime.paths import sidecar_adapter_dir
        from ooospec.runtime.sidecar import prompts as sp

        if dtype not in ("auto", None):
            raise ValueError(f"the llama.cpp engine runs the base GGUF's own weight types; got dtype={dtype!r}")
        adapter_dir = sidecar_adapter_dir(adapter_dir)
        meta = sp.read_metadata(adapter_dir)
        base = meta.get("base") or ""
        if base not in REGISTRY and not base.endswith(".gguf"):
            raise ValueError(f"{adapter_dir}: base {base!r} is not a registry model or .gguf file; the llama.cpp "
                             "engine needs the GGUF the adapter was trained on (use --engine transformers)")
        gguf = gguf_path_of(base)
        target = LlamaCppTarget(gguf, threads=threads, n_ctx=n_ctx, max_leaves=DEFAULT_SEQS,
                                lora=adapter_gguf(adapter_dir, gguf))
        tok = AutoTokenizer.from_pretrained(str(adapter_dir))
        return cls(target, tok, max_new_tokens=max_new_tokens, metadata=meta, max_draft_nodes=max_draft_nodes)

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def threads(self) -> int:
        return self.model.threads

    @property
    def weights(self) -> str:
        return self.model.weight_type

    def decode(self, block, queries, *, max_new_tokens: int, should_stop=None, logprobs: int = 0):
        return self.waves.decode(block, queries, max_new_tokens=max_new_tokens, eos_token_ids=self.eos_token_ids,
                                 should_stop=should_stop, propose=self.drafter(block, queries),
                                 max_draft_nodes=self.max_draft_nodes, logprobs=logprobs)

    def prefill(self, block: str) -> int:
        ids = self.tokenizer(block, add_special_tokens=False)["input_ids"]
        return max(len(ids) - 1 - self.waves.prefill(ids[:-1]), 0)

    def cache_info(self) -> dict:
        return {"kind": "last block in llama.cpp sequence 0", "tokens": len(self.waves.block)}

    def reset_cache(self) -> None:
        self.waves.forget()

    def calibrate(self, **wave) -> dict:
        def cold(block, queries, **kw):      # every run prefills its block: no reuse between the repeats
            self.waves.forget()
            return self.waves.decode(block, queries, **kw)

        return measure_wave_cost(None, vocab_size=self.vocab_size, max_draft_nodes=self.max_draft_nodes, decode=cold,
                                 **wave)
