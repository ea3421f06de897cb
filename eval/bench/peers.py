"""Hugging Face ``generate`` as benchmark peers: stock greedy, prompt lookup and assisted decoding.

Each peer runs transformers' own ``model.generate(..., do_sample=False)`` (5.24 API) on one prompt and returns a
:class:`~ooospec.eval.bench.method_api.MethodResult`, so the harness treats it exactly like an engine method::

    hf-greedy     generate(ids, do_sample=False)                                  the stock greedy reference
    hf-pld        generate(ids, do_sample=False, prompt_lookup_num_tokens=k)
    hf-assisted   generate(ids, do_sample=False, assistant_model=draft)           (a same-vocab draft model)

Counting and timing. ``generate`` exposes no forward counter, so :class:`ForwardCounter` wraps the target's
``forward`` for the duration of one call and records each call's query length. HF's prefill forward also produces
the first new token, so every recorded forward counts as a *target forward* (the engine's prefill of
``prompt[:-1]`` produces none and is not counted there); plain greedy therefore has ``n_forwards ==
len(tokens)`` in both, and #MAT = tokens / forwards means the same thing. ``prefill_s`` runs from the call to the
end of the first forward, ``decode_s`` from there to the return.

Stopping. The harness' stop predicate (EOS, end of the tool call, ``max_new_tokens``) is passed as a
``StoppingCriteria``. Assisted decoding only checks it after a whole accepted draft, so it can overshoot the end of
the call by a few tokens; the tokens are cut back at the first stop point (the overshoot's compute stays in the
timing, it is what the peer really does) and ``MethodResult.overshoot`` says how many were cut.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from transformers import GenerationConfig, PreTrainedModel, StoppingCriteria, StoppingCriteriaList

from ooospec.eval.bench.method_api import MethodResult

if TYPE_CHECKING:
    from typing_extensions import Self

StopFn = Callable[[Sequence[int]], bool]


class ForwardCounter:
    """Record the query length of every ``model.forward`` call made inside a ``with`` block.

    The wrapper is an instance attribute shadowing the class' ``forward`` (``nn.Module.__call__`` looks it up on
    the instance); ``functools.wraps`` keeps ``inspect.signature`` intact, which ``generate`` inspects. The
    attribute is removed on exit, restoring the original method.

    Attributes:
        q_lens: ``[num_forwards]`` tokens fed to each forward (prefill = prompt length (+ draft, for PLD)).
        t_first: ``time.perf_counter()`` at the end of the first forward (None before it).
    """

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.q_lens: list[int] = []
        self.t_first: float | None = None

    def __enter__(self) -> Self:
        inner = self.model.forward

        @functools.wraps(inner)
        def counted(*args, **kwargs):
            out = inner(*args, **kwargs)
            ids = kwargs.get("input_ids", args[0] if args else None)
            self.q_lens.append(int(ids.shape[-1]))
            if self.t_first is None:
                self.t_first = time.perf_counter()
            return out

        self.model.forward = counted
        return self

    def __exit__(self, *exc) -> None:
        del self.model.forward


class StopOnPredicate(StoppingCriteria):
    """A ``StoppingCriteria`` calling ``stop(generated_ids)`` on the tokens after the prompt (batch 1)."""

    def __init__(self, stop: StopFn, prompt_len: int):
        self.stop = stop
        self.prompt_len = prompt_len

    def __call__(self, input_ids: torch.LongTensor, scores=None, **kwargs) -> torch.BoolTensor:
        done = bool(self.stop(input_ids[0, self.prompt_len:].tolist()))
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


def cut_at_stop(tokens: Sequence[int], eos_token_ids: Sequence[int], stop: StopFn | None,
                max_new_tokens: int) -> list[int]:
    """The prefix of ``tokens`` that one-token decoding with the same stop rule would have produced.

    Ends after the first EOS, after the first token for which ``stop(prefix)`` is True, or at ``max_new_tokens``.

    >>> cut_at_stop([5, 6, 2, 7], eos_token_ids=[2], stop=None, max_new_tokens=10)
    [5, 6, 2]
    >>> cut_at_stop([5, 6, 7, 8], eos_token_ids=[], stop=lambda g: g[-1] == 6, max_new_tokens=10)
    [5, 6]
    """
    eos = set(eos_token_ids)
    out: list[int] = []
    for tok in tokens[:max_new_tokens]:
        out.append(int(tok))
        if tok in eos or (stop is not None and stop(out)):
            break
    return out


def greedy_config(eos_token_ids: Sequence[int], pad_token_id: int | None, max_new_tokens: int,
                  **extra) -> GenerationConfig:
    """A greedy ``GenerationConfig`` that overrides every logits processor a checkpoint's config could switch on.

    ``generate`` fills unset fields from ``model.generation_config`` (a shipped ``repetition_penalty=1.1`` would
    silently change greedy output), so the neutral values are set explicitly here.
    """
    return GenerationConfig(
        do_sample=False, num_beams=1, max_new_tokens=max_new_tokens, min_length=0,
        repetition_penalty=1.0, no_repeat_ngram_size=0, eos_token_id=list(eos_token_ids),
        pad_token_id=pad_token_id if pad_token_id is not None else eos_token_ids[0], **extra,
    )


def hf_generate(
    model: PreTrainedModel,
    prompt_ids: Sequence[int],
    *,
    eos_token_ids: Sequence[int],
    max_new_tokens: int,
    stop: StopFn | None,
    pad_token_id: int | None = None,
    assistant_model: PreTrainedModel | None = None,
    note: str = "",
    cache=None,
    **gen_kwargs,
) -> MethodResult:
    """One greedy ``model.generate`` call on ``prompt_ids`` with forwards counted (see the module docstring).

    Args:
        model: the target.
        prompt_ids: the rendered prompt's token ids.
        eos_token_ids: stop tokens (non-empty).
        max_new_tokens: generation budget.
        stop: ``stop(generated_ids) -> bool``, the harness' end-of-call predicate (None: EOS / budget only).
        assistant_model: a draft model for assisted decoding (same vocabulary).
        cache: a ``DynamicCache`` holding a prefix of ``prompt_ids`` (:class:`WarmPrefix`); generate continues
            from it and prefills only the rest.
        gen_kwargs: extra ``GenerationConfig`` fields, e.g. ``prompt_lookup_num_tokens=10``.
    """
    prompt_len = len(prompt_ids)
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long, device=model.device)
    config = greedy_config(eos_token_ids, pad_token_id, max_new_tokens, **gen_kwargs)
    criteria = StoppingCriteriaList([StopOnPredicate(stop, prompt_len)] if stop is not None else [])
    cached = 0 if cache is None else cache.get_seq_length()
    extra = {} if cache is None else {"cache": cache}
    t0 = time.perf_counter()
    with ForwardCounter(model) as counter, torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                             stopping_criteria=criteria, assistant_model=assistant_model, **extra)
    t_end = time.perf_counter()
    raw = out[0, prompt_len:].tolist()
    tokens = cut_at_stop(raw, eos_token_ids, stop, max_new_tokens)
    q_lens = counter.q_lens
    check_continued(q_lens, prompt_len, cached, max_draft=gen_kwargs.get("prompt_lookup_num_tokens") or 0)
    # the prefill forward carries the prompt (and, for prompt lookup, a first draft appended to it)
    tree_sizes = [q_lens[0] - (prompt_len - cached) + 1] + q_lens[1:]
    stop_reason = ("eos" if tokens and tokens[-1] in set(eos_token_ids)
                   else "stop" if stop is not None and tokens and stop(tokens)
                   else "max_new_tokens")
    return MethodResult(
        tokens=tokens,
        prefill_s=counter.t_first - t0,
        decode_s=t_end - counter.t_first,
        n_forwards=len(q_lens),
        tree_sizes=tree_sizes,
        stop_reason=stop_reason,
        overshoot=len(raw) - len(tokens),
        note=note,
    )


def check_continued(q_lens: Sequence[int], prompt_len: int, cached: int, *, max_draft: int = 0) -> None:
    """Raise unless ``generate`` continued from the ``cached`` prefix: its first forward may carry only the
    ``prompt_len - cached`` uncached tokens (+ up to ``max_draft`` drafted ones).

    transformers 5.24's prompt-lookup and assisted generation feed the WHOLE prompt on top of a pre-filled cache
    (the prompt then appears twice in the context): a timing of another computation and, in general, other tokens.
    Plain greedy ``generate`` slices correctly. The check keeps a future version that regresses from being timed.

    >>> check_continued([10, 1, 1], prompt_len=30, cached=20)
    >>> check_continued([35, 1], prompt_len=30, cached=20, max_draft=5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    RuntimeError: generate fed 35 tokens on top of a cached prefix of 20 (prompt 30, ...): it did not continue ...
    """
    if cached and q_lens and q_lens[0] > prompt_len - cached + max_draft:
        raise RuntimeError(f"generate fed {q_lens[0]} tokens on top of a cached prefix of {cached} (prompt "
                           f"{prompt_len}, at most {prompt_len - cached} + {max_draft} drafted expected): it did not "
                           "continue from the cache")


class WarmPrefix:
    """The bench's ``--warm-tools`` hook for stock greedy ``generate`` (``hf-greedy``): ``warm(prefix)`` runs the
    model over ``prefix`` (untimed) into a ``DynamicCache`` that the next ``generate`` continues from (``take``).
    Prompt lookup and assisted generation cannot continue from it (:func:`check_continued`)."""

    def __init__(self, model: PreTrainedModel):
        self.model = model
        self.cache = None

    def warm(self, prefix: Sequence[int], ctx=None) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        ids = torch.tensor([list(prefix)], dtype=torch.long, device=self.model.device)
        with torch.inference_mode():
            self.model(input_ids=ids, cache=self.cache, use_cache=True)

    def take(self):
        cache, self.cache = self.cache, None
        return cache


def same_vocab(model: PreTrainedModel, draft: PreTrainedModel) -> bool:
    """Whether ``draft`` can assist ``model`` token for token (equal text-config vocab sizes)."""
    return model.config.get_text_config().vocab_size == draft.config.get_text_config().vocab_size
