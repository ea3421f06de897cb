"""The llama.cpp backend: tree forwards over sequence ids give the same output as its own greedy decoding.

Tiny random GGUFs built in code (:mod:`tests.runtime.tiny_gguf`), float32 and requantized by llama.cpp (Q8_0,
Q4_0), under the adversarial drafters of ``test_engine_exact``. The large output-head scale keeps top-2 margins
far above llama.cpp's batch-shape rounding, so the output must be identical token for token; a separate test
measures that rounding directly. CI installs the bindings (``python -m ooospec.llamacpp_install``): there a missing
``llama_cpp`` fails instead of skipping.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

from ooospec.runtime.backends.llamacpp import TIE_MARGIN
from ooospec.runtime.backends.llamacpp_kv import leaf_seqs
from ooospec.runtime.tree import build_tree, chain_tree
from tests.runtime.test_engine_exact import KINDS, VOCAB, adversarial_drafter

if os.environ.get("CI"):
    import llama_cpp  # noqa: F401 - CI must have the backend
else:
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (python -m ooospec.llamacpp_install)")

from ooospec.runtime.backends.llamacpp import LlamaCppTarget, greedy_reference
from ooospec.runtime.decoding import build_engine, make_engine
from tests.runtime.tiny_gguf import make_tiny_gguf, quantize

FORMATS = ["F32", "Q8_0", "Q4_0"]


@pytest.fixture(scope="module")
def ggufs(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("gguf")
    f32 = make_tiny_gguf(root / "tiny-f32.gguf", vocab=VOCAB + 20, head_scale=8.0)
    out = {"F32": str(f32)}
    for fmt in FORMATS[1:]:
        out[fmt] = str(quantize(f32, root / f"tiny-{fmt}.gguf", fmt))
    return out


@pytest.fixture(scope="module")
def targets(ggufs):
    made = {fmt: LlamaCppTarget(path, threads=2, n_ctx=1024, max_leaves=32) for fmt, path in ggufs.items()}
    yield made
    for t in made.values():
        t.close()


def _prompt(seed: int, n: int) -> list[int]:
    return random.Random(seed).choices(range(3, VOCAB), k=n)


def test_leaf_seqs_worked_example():
    # root(9) -> 7 -> {3, 4}, root -> 5: nodes 0..4 = 9, 7, 3, 4, 5; leaves 3 (node 2), 4 (node 3), 5 (node 4)
    tree = build_tree(9, [[7, 3], [7, 4], [5]], max_nodes=8)
    seqs, n_leaves = leaf_seqs(tree)
    assert n_leaves == 3
    assert seqs == [[0, 1, 2], [0, 1], [0], [1], [2]]
    assert leaf_seqs(chain_tree([1, 2, 3]))[0] == [[0], [0], [0]]


@pytest.mark.parametrize("fmt", FORMATS)
def test_ar_equals_plain_llama_cpp_greedy(targets, fmt):
    target = targets[fmt]
    for seed in range(3):
        prompt = _prompt(seed, 40)
        ours = build_engine("ar", target).generate(prompt, 24).tokens
        ref, _, _ = greedy_reference(target, prompt, 24, eos_token_ids=[])
        assert ours == ref


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("kind", KINDS)
def test_adversarial_drafts_leave_the_output_unchanged(targets, fmt, kind):
    target = targets[fmt]
    for seed in range(2):
        prompt = _prompt(100 + seed, 30)
        ar = build_engine("ar", target).generate(prompt, 400).tokens
        reference = prompt + ar
        engine = make_engine(target, [adversarial_drafter(kind, reference, seed)], policy="fixed",
                             max_draft_nodes=24, max_depth=8)
        out = engine.generate(prompt, 30)
        assert out.tokens == ar[:30]
        if kind == "oracle":
            assert out.n_forwards < 30   # the drafts were verified and accepted, not only survived


def test_tree_logits_match_one_token_logits_within_the_tie_margin(targets):
    """Batch-shape numerics: a chain scored in one forward vs token by token (same cache, same positions).

    llama.cpp's batched kernels (llamafile's tiled matmuls, repacked Q4_0) accumulate in another order than its
    one-token dot products: F32 and Q8_0 differ by < 0.01 here, Q4_0 by ~0.27; the registry's Qwen GGUFs by up to
    ~0.37 (``python -m ooospec.eval.substrate``). The tie margin must stay above what is measured."""
    for fmt, target in targets.items():
        prompt, chain = _prompt(7, 50), _prompt(8, 16)
        kv = target.new_kv_cache()
        kv.prefill(prompt[:-1])
        batched = kv.forward_tree(chain_tree([prompt[-1]] + chain))
        kv.commit([])
        singles = []
        for tok in [prompt[-1]] + chain:
            singles.append(kv.forward_tree(chain_tree([tok]))[0])
            kv.commit([0])
        diff = (batched - torch.stack(singles)).abs().max().item()
        assert diff < TIE_MARGIN, f"{fmt}: batch-shape difference {diff:.2e} exceeds the tie margin {TIE_MARGIN}"


def test_commit_keeps_exactly_the_accepted_path(targets):
    """After a branching tree, the next logits equal those of a cache prefilled with the committed tokens."""
    target = targets["F32"]
    prompt = _prompt(11, 30)
    kv = target.new_kv_cache()
    kv.prefill(prompt[:-1])
    tree = build_tree(prompt[-1], [[5, 6, 7], [5, 8], [9, 10], [11]], max_nodes=16)
    kv.forward_tree(tree)
    kept = tree.path_to(tree.children[tree.children[0][5]][8])   # root -> 5 -> 8, not the first branch
    kv.commit(kept)
    assert kv.tokens == prompt[:-1] + [tree.tokens[i] for i in kept]
    after = kv.forward_tree(chain_tree([3]))[0]
    kv.commit([0])

    fresh = target.new_kv_cache()
    fresh.reset()
    fresh.prefill(prompt[:-1] + [tree.tokens[i] for i in kept])
    expected = fresh.forward_tree(chain_tree([3]))[0]
    fresh.commit([0])
    assert torch.allclose(after, expected, atol=1e-4)


def test_a_cache_that_lost_the_context_starts_over(targets):
    """Two caches of one target: each use by the other empties it, the engine re-prefills, output unchanged."""
    target = targets["F32"]
    prompt = _prompt(21, 30)
    first, second = build_engine("ar", target), build_engine("ar", target)
    a1 = first.generate(prompt, 10).tokens
    b = second.generate(_prompt(22, 25), 10).tokens
    cont = prompt + a1 + [a1[-1]]
    a2 = first.generate(cont, 5, cache=first.kv)   # first's cache was taken: nothing to reuse
    assert a2.num_cached == 0
    assert a2.tokens == build_engine("ar", target).generate(cont, 5).tokens
    assert b == build_engine("ar", target).generate(_prompt(22, 25), 10).tokens


def test_continuing_from_the_cache_reuses_the_prefix(targets):
    target = targets["Q8_0"]
    engine = build_engine("pld", target)
    prompt = _prompt(31, 40)
    out = engine.generate(prompt, 12)
    follow = prompt + out.tokens + _prompt(32, 5)
    again = engine.generate(follow, 8, cache=engine.kv)
    assert again.num_cached == len(prompt) + len(out.tokens) - 1
    assert again.tokens == build_engine("ar", target).generate(follow, 8).tokens


def test_the_target_interface_reads_the_gguf(targets):
    """Shape, EOS, footprint and cost key come from the GGUF itself (``tiny_gguf``: 2 layers, hidden 64, 4 heads,
    2 KV heads, EOS 2)."""
    from ooospec.runtime.backends.cost_model import calibration_key
    from ooospec.runtime.backends.target import as_target

    target = targets["F32"]
    assert as_target(target) is target and target.backend == "llama.cpp" and target.vocab_size == VOCAB + 20
    assert (target.shape.num_layers, target.shape.num_heads, target.shape.num_kv_heads) == (2, 4, 2)
    assert 2 in target.eos_token_ids()
    fp = target.footprint()
    assert fp.num_layers == 2 and fp.attn_dim == 64 and fp.kv_bytes_per_token == 2 * 2 * 2 * 16 * 2   # f16 K, V
    kv = target.new_kv_cache()
    kv.reset()
    kv.prefill(_prompt(3, 6))
    assert kv.nbytes == 6 * fp.kv_bytes_per_token
    assert calibration_key(target, 8).startswith(f"llama.cpp|{target.path.name}|") and "|threads=2|" in \
        calibration_key(target, 8)


def test_errors_are_clear(tmp_path, targets):
    with pytest.raises(FileNotFoundError, match="no such GGUF"):
        LlamaCppTarget(tmp_path / "missing.gguf")
    kv = targets["F32"].new_kv_cache()
    kv.prefill(_prompt(1, 5))
    kv.forward_tree(chain_tree([4, 5]))
    with pytest.raises(RuntimeError, match="twice without commit"):
        kv.forward_tree(chain_tree([4]))
    with pytest.raises(ValueError, match="cannot keep 3 nodes"):
        kv.commit([0, 1, 2])
    kv.commit([])
    with pytest.raises(ValueError, match="does not fit n_ctx"):
        kv.prefill(list(range(3, 3 + 2000)))


def test_bench_on_the_llamacpp_backend_against_its_peers(tmp_path):
    """The bench with a llama.cpp target: llama.cpp greedy is the reference, every method is exact, the
    'vs llama.cpp' column is filled, cold and warm toolbox alike."""
    from ooospec.eval.bench import harness
    from ooospec.eval.bench import methods as bench_methods
    from ooospec.runtime.formats import detect_format
    from tests.eval.test_bench import byte_tokenizer, toy_records

    tok = byte_tokenizer()
    gguf = make_tiny_gguf(tmp_path / "bench.gguf", vocab=320, head_scale=8.0, seed=3)
    target = LlamaCppTarget(gguf, threads=1, n_ctx=1024, max_leaves=32)
    try:
        factories, _ = bench_methods.build_methods(["ar", "toolspec", "llama.cpp", "llama.cpp-pld"], target, tok,
                                                   eos_token_ids=bench_methods.eos_ids(target, tok), gguf=gguf,
                                                   threads=1)
        assert list(factories) == ["ar", "llama.cpp", "toolspec", "llama.cpp-pld"]
        for warm in (False, True):
            res = harness.run_bench(target, tok, toy_records(), factories, fmt=detect_format(tok),
                                  max_new_tokens=20, progress=False, warm_tools=warm)
            for name, summary in res["methods"].items():
                assert summary["exact_rate"] == 1.0 and summary["exact_hf_rate"] == 1.0, (warm, name)
                assert summary["vs_llamacpp"] > 0
            assert res["methods"]["llama.cpp"]["vs_llamacpp"] == pytest.approx(1.0)
            assert all((r["warm_tokens"] > 0) == warm for r in res["examples"])
    finally:
        target.close()


def test_tie_margin_is_calibrated_from_the_measured_batch_shape_difference(targets, monkeypatch, tmp_path):
    from ooospec.runtime.backends import llamacpp

    monkeypatch.setenv("OOOSPEC_CACHE", str(tmp_path))
    monkeypatch.setattr(llamacpp, "_NUMERICS", {})
    target = targets["Q4_0"]
    measured = llamacpp.batch_shape_diff(target)
    assert measured == llamacpp.batch_shape_diff(target)    # deterministic
    diff = measured.max_abs_logit_diff
    target._tie_margin = None
    assert target.tie_margin == pytest.approx(max(llamacpp.TIE_MARGIN, llamacpp.TIE_FACTOR * diff))
    assert "llamacpp_batch_shape_diff" in (tmp_path / "hardware.json").read_text()
    noisier = llamacpp.BatchShapeDiff(3.0, argmax_differs=True)   # a noisier kernel -> a wider margin
    monkeypatch.setattr(llamacpp, "batch_shape_diff", lambda *a, **k: noisier)
    monkeypatch.setattr(llamacpp, "_NUMERICS", {})
    (tmp_path / "hardware.json").unlink()
    target._tie_margin = None
    assert target.tie_margin == 6.0
    target._tie_margin = None


def test_the_llamacpp_peer_loads_without_extra_buffers_where_our_backend_does(tmp_path, monkeypatch):
    """On an AMX CPU the stock ``Llama`` (the `llama.cpp` peer) segfaulted at its first forward: llama.cpp's AMX
    matmul with its extra buffers (the reason our backend turns them off there). The peer now loads as our backend."""
    import llama_cpp.llama_cpp as lib

    from ooospec.eval.bench import llamacpp_peers
    from ooospec.runtime.backends import llamacpp

    default = lib.llama_model_default_params
    assert default().use_extra_bufts is True                       # llama.cpp's own default
    with pytest.raises(RuntimeError), llamacpp_peers.extra_buffers(False):
        assert lib.llama_model_default_params().use_extra_bufts is False
        raise RuntimeError("a failed load")
    assert lib.llama_model_default_params is default               # restored, even after an error
    gguf = make_tiny_gguf(tmp_path / "peer.gguf", vocab=320, head_scale=8.0, seed=3)
    for repack in (False, True):
        monkeypatch.setattr(llamacpp, "default_repack", lambda r=repack: (r, "as this CPU needs"))
        peer = llamacpp_peers.LlamaCppPeer(gguf, threads=1, n_ctx=256)
        assert peer.repack is repack and peer.llm.model_params.use_extra_bufts is repack
