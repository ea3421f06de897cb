"""Retrieval drafting (ToolSpec): propose what followed the same tokens in earlier calls.

A ``CallBank`` keeps the token sequences of finished calls (each with a few prompt tokens in front, so that
the start of an output can match too), bounded by count with least-recently-used eviction and optionally
persisted to a JSONL file. ``RetrievalDrafter`` suffix-matches the committed tokens against the bank:
the longest suffix of length in ``[min_match, max_match]`` that occurs in a stored sequence, then proposes
the ``num_draft`` tokens that followed it there, one candidate per distinct continuation.

Worked example (``min_match=2``, bank ``[1, 2, 3, 4, 5]`` then ``[7, 2, 3, 8]``), committed ``[.., 9, 2, 3]``:
suffix ``[9, 2, 3]`` occurs nowhere, ``[2, 3]`` occurs in both, so the candidates are ``[8]`` (the newer
sequence) then ``[4, 5]``.
"""

from __future__ import annotations

import json
from collections import OrderedDict, defaultdict
from collections.abc import Sequence
from pathlib import Path

from ooospec.runtime.drafters.base import DraftContext, Drafter


class CallBank:
    """Token sequences of earlier calls, at most ``capacity`` of them (LRU by count), indexed by n-gram.

    Args:
        capacity: most sequences kept; adding one more evicts the least recently used.
        min_match: the n-gram length of the index (the shortest suffix match a drafter can use).
        path: optional JSONL file (``{"tokens": [...]}`` per line): loaded at start, appended on ``add``.
    """

    def __init__(self, capacity: int = 256, min_match: int = 2, path: str | Path | None = None):
        if capacity < 1 or min_match < 1:
            raise ValueError(f"capacity and min_match must be >= 1, got {capacity}, {min_match}")
        self.capacity = capacity
        self.min_match = min_match
        self.path = Path(path) if path is not None else None
        self._seqs: OrderedDict[tuple[int, ...], int] = OrderedDict()  # oldest first -> use stamp
        self._clock = 0
        self._index: dict[tuple[int, ...], set[tuple[tuple[int, ...], int]]] = defaultdict(set)
        if self.path is not None and self.path.is_file():
            with open(self.path) as f:
                for lineno, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            self._insert(tuple(int(t) for t in json.loads(line)["tokens"]))
                        except (ValueError, KeyError, TypeError) as e:
                            raise ValueError(f"{self.path}:{lineno}: not a bank line ({e})") from e

    def __len__(self) -> int:
        return len(self._seqs)

    def __iter__(self):
        """Stored sequences, least recently used first."""
        return iter(list(self._seqs))

    def _grams(self, seq: tuple[int, ...]):
        n = self.min_match
        for end in range(n, len(seq)):  # a gram is useful only if a token follows it
            yield seq[end - n:end], end

    def _stamp(self, seq: tuple[int, ...]) -> None:
        self._clock += 1
        self._seqs[seq] = self._clock
        self._seqs.move_to_end(seq)

    def _insert(self, seq: tuple[int, ...]) -> None:
        if seq in self._seqs:
            self._stamp(seq)
            return
        self._stamp(seq)
        for gram, end in self._grams(seq):
            self._index[gram].add((seq, end))
        while len(self._seqs) > self.capacity:
            old, _ = self._seqs.popitem(last=False)
            for gram, end in self._grams(old):
                self._index[gram].discard((old, end))
                if not self._index[gram]:
                    del self._index[gram]

    def add(self, tokens: Sequence[int]) -> None:
        """Store one sequence (or refresh it if already stored) and append it to ``path``."""
        seq = tuple(int(t) for t in tokens)
        if len(seq) <= self.min_match:
            return
        self._insert(seq)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a") as f:
                f.write(json.dumps({"tokens": list(seq)}) + "\n")

    def touch(self, seq: tuple[int, ...]) -> None:
        """Mark a stored sequence as used (it moves to the back of the eviction queue)."""
        if seq in self._seqs:
            self._stamp(seq)

    def recency(self, seq: tuple[int, ...]) -> int:
        """When ``seq`` was last added or used (larger = more recent)."""
        return self._seqs[seq]

    def occurrences(self, gram: tuple[int, ...]) -> set[tuple[tuple[int, ...], int]]:
        """``(sequence, end)`` pairs where ``sequence[end - min_match:end] == gram``."""
        return self._index.get(tuple(gram), set())


def _match_len(tokens: Sequence[int], seq: tuple[int, ...], end: int, limit: int) -> int:
    """How many tokens before ``end`` in ``seq`` equal the last tokens of ``tokens`` (at most ``limit``)."""
    n = 0
    while n < limit and n < end and n < len(tokens) and seq[end - 1 - n] == tokens[len(tokens) - 1 - n]:
        n += 1
    return n


class RetrievalDrafter(Drafter):
    """Drafts continuations copied from earlier calls in a ``CallBank``.

    Args:
        bank: the shared bank (a fresh in-memory one when None).
        max_match: longest suffix compared (longer matches rank first).
        num_draft: tokens proposed per candidate.
        max_candidates: most candidates per step.
        prompt_tail: prompt tokens stored in front of each observed output.
    """

    name = "retrieval"

    def __init__(self, bank: CallBank | None = None, max_match: int = 8, num_draft: int = 16,
                 max_candidates: int = 4, prompt_tail: int = 4):
        self.bank = bank if bank is not None else CallBank()
        self.max_match = max(max_match, self.bank.min_match)
        self.num_draft = num_draft
        self.max_candidates = max_candidates
        self.prompt_tail = prompt_tail

    def propose_tokens(self, tokens: Sequence[int]) -> list[list[int]]:
        """Candidates after ``tokens``: longest suffix match first, then the most recent sequence.

        >>> bank = CallBank(min_match=2)
        >>> bank.add([1, 2, 3, 4, 1, 2, 3])
        >>> d = RetrievalDrafter(bank, num_draft=3)
        >>> d.propose_tokens([9, 4, 1, 2])   # [4, 1, 2] matches 3 tokens, the earlier [1, 2] only 2
        [[3], [3, 4, 1]]
        >>> d.propose_tokens([5, 2, 3])
        [[4, 1, 2]]
        """
        k = self.bank.min_match
        if len(tokens) < k:
            return []
        ranked = []
        for seq, end in self.bank.occurrences(tuple(tokens[-k:])):
            length = _match_len(tokens, seq, end, self.max_match)
            ranked.append((-length, -self.bank.recency(seq), end, seq))
        out: list[list[int]] = []
        for _, _, end, seq in sorted(ranked):
            cont = list(seq[end:end + self.num_draft])
            if cont not in out:
                out.append(cont)
                self.bank.touch(seq)
            if len(out) == self.max_candidates:
                break
        return out

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        return self.propose_tokens(ctx.tokens)

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Add a finished call: the last ``prompt_tail`` prompt tokens + its output tokens."""
        head = list(prompt[-self.prompt_tail:]) if self.prompt_tail else []
        self.bank.add(head + list(output))
