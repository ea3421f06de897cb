"""A conversation's KV kept across turns, and a bounded prefix cache of shared system + tools blocks.

An agent turn's prompt is the previous prompt + the model's output + the tool result message + a new
generation prompt. A :class:`Session` keeps the target's KV cache between turns, so the next turn prefills only
its new tokens (``SpecEngine.generate(..., cache=session.kv)``). That holds only while the chat template renders
a *token* prefix of what is cached; templates do re-render earlier text (Qwen2.5 closes a tool turn differently
once a second tool message follows it; a client sends the call back with other spacing; the tools list grows),
so every turn compares token ids, keeps the longest common prefix and prefills the rest -- a *rerender*,
counted with the entries it dropped. Output is exact either way: only entries for identical ids at identical
positions are reused (``tests/runtime/agent/test_session.py`` checks every turn against a fresh full prefill).

:class:`PrefixCache` keeps KV snapshots of prompt prefixes that many conversations share (the system message and
the tools block), LRU-evicted by a token and a byte budget, with hit / miss counts; a new conversation starts
from the longest stored prefix of its prompt. :class:`SessionStore` picks the session a request continues (the
one whose cached tokens share more than the shared block with the prompt, i.e. the same conversation), or starts
a new one from the longest prefix it can copy: a stored block, or what an existing session shares with the prompt
(a *fork*: e.g. the same conversation after a tool search added a tool to its tools block).

    store = SessionStore(model, max_sessions=8, prefix_cache=PrefixCache(max_tokens=32768))
    session, origin = store.session_for(prompt_ids, shared_len=412)   # "session" | "fork" | "prefix" | "new"
    result = session.generate(engine, prompt_ids, 256, stop)          # result.num_cached tokens not prefilled
    store.remember_prefix(session, shared_len=412)                    # the system + tools block, for others

Both backends: on llama.cpp, whose one context holds one KV store, a session's cache is persistent (parked --
copied out and back -- while another conversation runs) and snapshots are copies of its cells
(:mod:`ooospec.runtime.backends.llamacpp_kv`).

Not thread-safe: one request at a time per store (the chat server serializes generation).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Literal

from ooospec.runtime.backends.kv_cache import KVSnapshot
from ooospec.runtime.backends.target import Target, as_target
from ooospec.runtime.engine import GenerationResult, SpecEngine
from ooospec.runtime.tokens import common_prefix_len

if TYPE_CHECKING:
    from transformers import PreTrainedModel

Origin = Literal["session", "fork", "prefix", "new"]


@dataclass
class PrefixCacheStats:
    hits: int = 0            # lookups that found a stored prefix of the prompt
    misses: int = 0
    inserts: int = 0
    evictions: int = 0
    refused: int = 0         # snapshots larger than the whole budget
    hit_tokens: int = 0      # prompt tokens served from stored prefixes


class PrefixCache:
    """LRU of KV snapshots keyed by their token ids, bounded by ``max_tokens`` and ``max_bytes`` in total.

    ``lookup(tokens)`` returns the longest stored snapshot whose ids are a prefix of ``tokens`` (a hit moves it to
    the most recently used end). Example: stored ``[1, 2, 3]`` and ``[1, 2, 3, 4, 5]``; ``lookup([1, 2, 3, 4, 5,
    9])`` returns the second, ``lookup([1, 2, 7])`` misses (a stored prefix must match whole).
    """

    def __init__(self, max_tokens: int = 32768, max_bytes: int = 512 << 20):
        if max_tokens < 1 or max_bytes < 1:
            raise ValueError(f"max_tokens and max_bytes must be >= 1, got {max_tokens}, {max_bytes}")
        self.max_tokens, self.max_bytes = max_tokens, max_bytes
        self._entries: OrderedDict[tuple[int, ...], KVSnapshot] = OrderedDict()
        self.num_tokens = 0
        self.num_bytes = 0
        self.stats = PrefixCacheStats()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, tokens: Sequence[int]) -> bool:
        return tuple(tokens) in self._entries

    def lookup(self, tokens: Sequence[int]) -> KVSnapshot | None:
        """The longest stored snapshot whose ids are a prefix of ``tokens``; None (a miss) when there is none."""
        best: KVSnapshot | None = None
        for key, snap in self._entries.items():
            if len(key) <= len(tokens) and (best is None or len(key) > len(best.tokens)) \
                    and tuple(tokens[:len(key)]) == key:
                best = snap
        if best is None:
            self.stats.misses += 1
            return None
        self._entries.move_to_end(best.tokens)
        self.stats.hits += 1
        self.stats.hit_tokens += len(best.tokens)
        return best

    def lookup_shared(self, tokens: Sequence[int], min_tokens: int = 1) -> tuple[KVSnapshot, int] | None:
        """The stored snapshot sharing the longest token prefix with ``tokens``, and that length (at least
        ``min_tokens``); None (a miss) otherwise. Unlike :meth:`lookup` a stored entry may run past ``tokens`` or
        diverge from them: its first ``n`` entries are what a prefill of ``tokens[:n]`` computes (same ids, same
        positions, same prefix). Stored ``[1, 2, 3, 4]``; ``lookup_shared([1, 2, 9])`` returns it with ``n = 2``.
        """
        best, best_n = None, 0
        for key, snap in self._entries.items():
            n = common_prefix_len(key, tokens)
            if n > best_n:
                best, best_n = snap, n
        if best is None or best_n < max(min_tokens, 1):
            self.stats.misses += 1
            return None
        self._entries.move_to_end(best.tokens)
        self.stats.hits += 1
        self.stats.hit_tokens += best_n
        return best, best_n

    def clear(self) -> None:
        """Drop every stored snapshot (the counters stay)."""
        self._entries.clear()
        self.num_tokens = self.num_bytes = 0

    def insert(self, snap: KVSnapshot) -> bool:
        """Store ``snap`` (evicting least recently used entries to fit); False when it alone exceeds the budget."""
        if not snap.tokens:
            return False
        if snap.tokens in self._entries:
            self._entries.move_to_end(snap.tokens)
            return True
        if len(snap.tokens) > self.max_tokens or snap.nbytes > self.max_bytes:
            self.stats.refused += 1
            return False
        while self._entries and (self.num_tokens + len(snap.tokens) > self.max_tokens
                                 or self.num_bytes + snap.nbytes > self.max_bytes):
            _, old = self._entries.popitem(last=False)
            self.num_tokens -= len(old.tokens)
            self.num_bytes -= old.nbytes
            self.stats.evictions += 1
        self._entries[snap.tokens] = snap
        self.num_tokens += len(snap.tokens)
        self.num_bytes += snap.nbytes
        self.stats.inserts += 1
        return True

    def to_dict(self) -> dict:
        return {**asdict(self.stats), "entries": len(self), "tokens": self.num_tokens, "bytes": self.num_bytes}


@dataclass
class SessionStats:
    turns: int = 0
    prompt_tokens: int = 0       # all turns' prompt tokens
    cached_tokens: int = 0       # prompt tokens whose KV was already there (not prefilled)
    prefilled_tokens: int = 0    # prompt tokens prefilled (the last prompt token is the first tree root, not here)
    rerenders: int = 0           # turns whose prompt was not an extension of the cached tokens (the fallback)
    dropped_tokens: int = 0      # cached entries dropped by those rerenders


class Session:
    """One conversation's KV cache across turns (see the module docstring)."""

    def __init__(self, model: Target | PreTrainedModel, session_id: str = ""):
        self.id = session_id
        self.kv = as_target(model).new_kv_cache(persistent=True)   # llama.cpp: parked while others run
        self.stats = SessionStats()

    @property
    def tokens(self) -> list[int]:
        """The token ids whose KV the session holds (the last prompt + output but its last token)."""
        return self.kv.tokens

    def generate(self, engine: SpecEngine, prompt_ids: Sequence[int], max_new_tokens: int,
                 stop: Callable[[Sequence[int]], bool] | None = None) -> GenerationResult:
        """``engine.generate`` continuing from this session's cache; counts reuse and rerenders.

        If generation fails the cache is emptied (it may hold an uncommitted forward), so the next turn prefills
        from scratch.
        """
        prompt = [int(t) for t in prompt_ids]
        kept = common_prefix_len(self.kv.tokens, prompt[:-1])
        if kept < self.kv.length:
            self.stats.rerenders += 1
            self.stats.dropped_tokens += self.kv.length - kept
        try:
            result = engine.generate(prompt, max_new_tokens, stop, cache=self.kv)
        except BaseException:
            self.kv.reset()
            raise
        self.stats.turns += 1
        self.stats.prompt_tokens += len(prompt)
        self.stats.cached_tokens += result.num_cached
        self.stats.prefilled_tokens += max(len(prompt) - 1 - result.num_cached, 0)
        return result


class SessionStore:
    """Sessions by conversation, at most ``max_sessions`` (least recently used dropped), plus the prefix cache.

    Args:
        model: the target (each session's cache belongs to it).
        max_sessions: sessions kept; each holds one conversation's whole KV.
        prefix_cache: shared blocks for new conversations; None = new conversations prefill from scratch.
    """

    def __init__(self, model: Target | PreTrainedModel, *, max_sessions: int = 8,
                 prefix_cache: PrefixCache | None = None):
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.target = as_target(model)
        self.max_sessions = max_sessions
        self.prefix_cache = prefix_cache
        self._sessions: OrderedDict[str, Session] = OrderedDict()
        self._ids = itertools.count()
        self.counts = {"session": 0, "fork": 0, "prefix": 0, "new": 0, "evicted": 0}
        self._retired = SessionStats()     # the stats of dropped sessions, so totals survive eviction

    def __len__(self) -> int:
        return len(self._sessions)

    def session_for(self, prompt_ids: Sequence[int], shared_len: int = 0) -> tuple[Session, Origin]:
        """The session that continues this prompt, and where its cache came from.

        ``"session"``: an existing session shares more than ``shared_len`` tokens (the system + tools block every
        conversation with these tools shares) with the prompt, i.e. holds an earlier turn of this conversation;
        the one sharing most wins. Otherwise a new session, started from the longest prefix on offer: a copy of
        what the best session shares (``"fork"``), the prefix cache's longest stored prefix (``"prefix"``), or
        nothing (``"new"``); the least recently used session is dropped beyond ``max_sessions``.
        """
        head = [int(t) for t in prompt_ids[:-1]]
        best, best_len = None, 0
        for session in self._sessions.values():
            n = common_prefix_len(session.tokens, head)
            if n > best_len:
                best, best_len = session, n
        if best is not None and best_len > shared_len:
            self._sessions.move_to_end(best.id)
            self.counts["session"] += 1
            return best, "session"
        session = Session(self.target, f"s{next(self._ids)}")
        origin: Origin = "new"
        snap = self.prefix_cache.lookup(head) if self.prefix_cache is not None else None
        if best is not None and best_len > (len(snap.tokens) if snap is not None else 0):
            snap, origin = best.kv.snapshot(best_len), "fork"
        elif snap is not None:
            origin = "prefix"
        if snap is not None:
            session.kv.load(snap)
        self._sessions[session.id] = session
        while len(self._sessions) > self.max_sessions:
            _, dropped = self._sessions.popitem(last=False)
            _add_stats(self._retired, dropped.stats)
            self.counts["evicted"] += 1
        self.counts[origin] += 1
        return session, origin

    def remember_prefix(self, session: Session, shared_len: int) -> None:
        """Store the session's first ``shared_len`` entries in the prefix cache (if it holds them, and not yet)."""
        if self.prefix_cache is None or shared_len < 1 or session.kv.length < shared_len:
            return
        if session.tokens[:shared_len] in self.prefix_cache:
            return
        self.prefix_cache.insert(session.kv.snapshot(shared_len))

    def stats(self) -> dict:
        """Sessions by origin, and :class:`SessionStats` summed over every session this store has held."""
        totals = SessionStats()
        for stats in [self._retired] + [s.stats for s in list(self._sessions.values())]:
            _add_stats(totals, stats)
        return {**self.counts, "live": len(self), **asdict(totals),
                "prefix_cache": self.prefix_cache.to_dict() if self.prefix_cache is not None else None}


def _add_stats(into: SessionStats, other: SessionStats) -> None:
    for k, v in asdict(other).items():
        setattr(into, k, getattr(into, k) + v)
