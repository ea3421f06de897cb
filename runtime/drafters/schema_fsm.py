"""Schema-aware drafting (ToolSpec): a JSON-call grammar state machine built from the tools' JSON Schemas.

The committed output text is fed through :class:`~ooospec.runtime.drafters.call_state.CallState` (an incremental
JSON-prefix parser that knows which part of ``{"name": ..., "arguments": {...}}`` it is in). ``next_pieces``
lists the legal next text pieces (most likely first): the fixed punctuation, every tool name consistent with the
typed prefix, unused argument keys (required first), enum / boolean / null values, the call suffix. Free-form
values (strings without enum, numbers, nested containers) get nothing: other drafters handle those. Schemas are
read through ``runtime.schemas`` (type lists such as ``["string", "null"]``, boolean sub-schemas, ``$ref`` into
the tool's ``$defs``); a value whose alternatives cannot all be listed (a free number, or more than ``MAX_OPTIONS``
values sharing no prefix) gets no draft, so a draft never excludes a value the schema allows.

``SchemaFSMDrafter`` expands the pieces into a few text continuations (branching at choice points while the
branch budget lasts, then following the first option) and turns each into target tokens *in context*.

Worked example (tools ``get_weather(city)``, ``get_time(tz)``, compact style)::

    committed text  '{"name": "get_'
    next pieces     ['weather"', 'time"']                      (names consistent with 'get_')
    continuations   ['weather", "arguments": {"city": "',     (deterministic run after each branch,
                     'time", "arguments": {"tz": "']           stopping inside the free string value)

Whitespace style is learnt from the committed text (Qwen2.5-Coder pretty-prints with ``indent=2`` inside a
```` ```json ```` fence; Hermes-style templates are compact ``", "`` / ``": "``); before anything is known the
opening branches cover both.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from ooospec.runtime import schemas
from ooospec.runtime.drafters.base import DraftContext, Drafter
from ooospec.runtime.drafters.call_state import CallState, parse_state

_FENCE = "```json\n"
MAX_OPTIONS = 32        # enumerated values listed at one choice point; more collapse to their common prefix


# ------------------------------------------------------------------------------------ grammar


def _json_text(value: Any) -> str | None:
    """The JSON text a model writes for ``value`` (``json.dumps``, ``ensure_ascii=False``); None if none."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None


def _typed_string(st: CallState) -> str:
    """The open string's JSON text so far, opening quote included (``"Par`` after ``"Par``), as the model
    writes it (``json.dumps`` escapes)."""
    pending = "\\" if st.esc else "" if st.uhex is None else "\\u" + st.uhex
    return '"' + json.dumps(st.buf, ensure_ascii=False)[1:-1] + pending


class Literals:
    """A finite set of JSON texts in preference order, with prefix lookups in O(log n + k).

    >>> Literals(['"celsius"', '"fahrenheit"', '"kelvin"']).completions('"')
    ['celsius"', 'fahrenheit"', 'kelvin"']
    """

    def __init__(self, texts: Sequence[str]):
        self.texts = list(dict.fromkeys(texts))
        self.rank = {t: i for i, t in enumerate(self.texts)}
        self.sorted = sorted(self.texts)

    def __contains__(self, text: str) -> bool:
        return text in self.rank

    def completions(self, prefix: str) -> list[str] | None:
        """What completes ``prefix`` to a longer text, in preference order.

        More than :data:`MAX_OPTIONS` matches collapse to their common continuation (still true of every
        match); None when they share none (too many to list, nothing certain).
        """
        lo = bisect.bisect_right(self.sorted, prefix)
        hi = bisect.bisect_left(self.sorted, prefix + "\U0010ffff", lo)
        while hi > lo and not self.sorted[hi - 1].startswith(prefix):
            hi -= 1
        if hi - lo <= MAX_OPTIONS:
            return [t[len(prefix):] for t in sorted(self.sorted[lo:hi], key=self.rank.__getitem__)]
        first, last = self.sorted[lo], self.sorted[hi - 1]
        n = len(prefix)
        while n < min(len(first), len(last)) and first[n] == last[n]:
            n += 1
        return [first[len(prefix):n]] if n > len(prefix) else None


@dataclass(frozen=True)
class _Values:
    """What one argument value may be (from ``schemas.admitted``).

    ``openings``: the pieces a value starts with -- openers of free strings / objects / arrays (``"``, ``{``,
    ``[``) and the enumerated texts (enum, const, ``true``/``false``, ``null``); empty when they cannot be
    listed (a free number, or too many values sharing no prefix). ``literals``: every enumerated text.
    """

    openings: tuple[str, ...]
    literals: Literals
    free_string: bool
    free_number: bool

    @classmethod
    def of(cls, schema: Any) -> _Values:
        starts: list[str] = []
        texts: list[str] = []
        free = set()
        for kind, values in schemas.admitted(schema).items():
            if values is None:
                free.add(kind)
                starts += {"string": ['"'], "object": ["{"], "array": ["["]}.get(kind, [])
                texts += {"boolean": ["true", "false"], "null": ["null"]}.get(kind, [])
            else:
                texts += [t for t in map(_json_text, values) if t is not None]
        literals = Literals(texts)
        listed = [t for t in literals.texts if t[0] not in starts]  # a free kind's opener covers its values
        if "number" in free:
            openings: list[str] = []
        elif len(listed) <= MAX_OPTIONS:
            openings = starts + listed
        else:
            common = os.path.commonprefix([min(listed), max(listed)])
            openings = starts + [common] if common else []
        return cls(tuple(openings), literals, "string" in free, "number" in free)


@dataclass
class _Tool:
    """One tool's arguments: keys (required first, each group in declaration order), required keys, their
    JSON texts and value spaces (built on first use)."""

    keys: list[str]
    required: list[str]
    props: dict[str, Any]
    key_texts: dict[str, str]
    values: dict[str, _Values] = field(default_factory=dict)

    @classmethod
    def of(cls, tool: Any) -> _Tool:
        params = schemas.tool_function(tool).get("parameters")
        props = schemas.properties(params)
        req = schemas.required(params)
        optional = [k for k, v in props.items() if k not in req and v is not False]
        keys = [k for k in props if k in req] + [k for k in req if k not in props] + optional
        return cls(keys, req, props, {k: json.dumps(k, ensure_ascii=False) for k in keys})

    def value(self, key: str | None) -> _Values:
        if key not in self.values:
            self.values[key] = _Values.of(self.props.get(key, True) if key is not None else True)
        return self.values[key]

    def unused(self, used: Sequence[str | None], skip: str | None = None) -> list[str]:
        done = set(used) | {skip}
        return [k for k in self.keys if k not in done]

    def closable(self, used: Sequence[str | None], also: str | None = None) -> bool:
        done = set(used) | {also}
        return all(k in done for k in self.required)


class CallGrammar:
    """The legal next text pieces of a call, given the tools, the format and the output's style.

    Tools are read through ``runtime.schemas`` (type lists, boolean sub-schemas, ``$ref``, malformed
    keywords); a tool without a string name is skipped, and a schema part it cannot read drafts nothing.
    """

    def __init__(self, fmt: ModuleType, tools: Sequence[Any]):
        self.fmt = fmt
        self.tools: dict[str, _Tool] = {}
        for tool in tools if isinstance(tools, (list, tuple)) else []:
            name = schemas.tool_name(tool)
            if name is not None and name not in self.tools:
                self.tools[name] = _Tool.of(tool)
        self.names = list(self.tools)
        self._name_texts = Literals([json.dumps(n, ensure_ascii=False) for n in self.names])
        self.call_keys = ("name", fmt.args_key)
        self.openers = self._openers()

    def _openers(self) -> list[str]:
        """How an output may open, up to the first key: the format's prefix, bare JSON, a fenced
        pretty-printed block (what Qwen2.5-Coder writes). ``learn_opener`` puts observed ones first."""
        out: list[str] = []
        for opener in (self.fmt.call_prefix + "{", "{", _FENCE + "{\n  "):
            if opener not in out:
                out.append(opener)
        return out

    def learn_opener(self, output_text: str) -> None:
        """Move the opening of a finished output (e.g. ``'```json\\n{\\n  '``) to the front of the openers."""
        st = parse_state(output_text)
        if st.mode in ("pre", "error") or "indent" not in st.known:
            return
        opener = st.pre.lstrip() + "{" + st.style.newline(1)
        self.openers = [opener] + [o for o in self.openers if o != opener]

    def _ws(self, st: CallState, want: str) -> str:
        """The part of the whitespace ``want`` not typed yet (all of it typed, or other whitespace: none)."""
        return want[len(st.ws):] if want.startswith(st.ws) else ""

    def _key(self, st: CallState, depth: int, key: str, after: str, key_text: str | None = None) -> str:
        """Text up to and including ``"key": `` for an object at ``depth`` (1 = the call object).

        ``after`` is where the text stands: ``"open"`` (just after ``{``), ``"comma"`` (just after ``,``),
        ``"value"`` (a value just ended, so the comma is part of the piece).
        """
        if st.style.indent is not None:
            sep = st.style.newline(depth)
        else:
            sep = "" if after == "open" else st.style.comma
        head = "," + sep if after == "value" else self._ws(st, sep)
        return head + (key_text or json.dumps(key, ensure_ascii=False)) + ":" + st.style.colon

    def _close(self, st: CallState, depth: int, empty: bool = False) -> str:
        """Text closing the object at ``depth``; an empty object closes right away (``{}``)."""
        return "}" if empty else self._ws(st, st.style.newline(depth - 1)) + "}"

    def next_pieces(self, st: CallState) -> list[str]:
        """Legal next text pieces after ``st``, most likely first; [] where the grammar does not decide."""
        if st.mode == "error" or (st.buf_full and st.mode in ("string", "literal")):
            return []
        if "indent" not in st.known and "\n" in st.ws and st.mode in ("key_or_end", "key"):
            st = st.clone()  # a newline after the brace, layout not settled yet: assume json.dumps(indent=2)
            st.style.indent = 2
        if st.mode == "pre":
            typed = st.pre.lstrip()
            return [o[len(typed):] for o in self.openers if o.startswith(typed) and len(o) > len(typed)]
        if st.mode == "done":
            tagged = self.fmt.call_prefix and self.fmt.call_prefix.strip() in st.pre
            suffix = ("\n```" if "```" in st.pre else "") + (self.fmt.call_suffix if tagged else "")
            done = not suffix.startswith(st.after) or len(suffix) == len(st.after)
            return [] if done else [suffix[len(st.after):]]
        depth = len(st.stack)
        if depth == 1:
            return self._call_level(st)
        if depth == 2 and st.stack[0].key == self.fmt.args_key and st.stack[1].kind == "{":
            return self._args_level(st)
        return []

    def _call_level(self, st: CallState) -> list[str]:
        top = st.stack[0]
        remaining = [k for k in self.call_keys if k not in top.keys]
        mode = st.mode
        if mode in ("key_or_end", "key"):
            if not remaining:
                return []
            key = self._key(st, 1, remaining[0], after="open" if mode == "key_or_end" else "comma")
            if mode == "key_or_end" and "indent" not in st.known and not st.ws:
                # just after the opening brace the layout is that of the openers the output matches so far
                # (a fence opens a pretty-printed body: '```json\n{' continues with '\n  ')
                typed = st.pre.lstrip() + "{"
                rests = [o[len(typed):] for o in self.openers if o.startswith(typed)]
                return list(dict.fromkeys(r or key for r in rests)) or [key]
            return [key]
        if mode == "string" and st.is_key:  # one key only: name first, as every format writes it
            return [k[len(st.buf):] + '":' + st.style.colon for k in remaining if k.startswith(st.buf)][:1]
        if mode == "colon":
            return [":" + st.style.colon]
        if mode == "value":
            start = {"name": '"', self.fmt.args_key: "{"}.get(top.key)
            return [self._ws(st, st.style.colon) + start] if start else []
        if mode == "string" and top.key == "name":
            return self._name_texts.completions(_typed_string(st)) or []
        if mode == "comma_or_end":
            if remaining:
                return [self._key(st, 1, remaining[0], after="value")]
            return [self._close(st, 1)]
        return []

    def _after_value(self, st: CallState, tool: _Tool, used: Sequence[str | None], also: str | None = None):
        """Pieces after a complete argument value: close the arguments (when every required key is there),
        then each unused key."""
        keys = [self._key(st, 2, k, after="value", key_text=tool.key_texts[k])
                for k in tool.unused(used, also)]
        return ([self._close(st, 2)] + keys) if tool.closable(used, also) else keys

    def _args_level(self, st: CallState) -> list[str]:
        tool = self.tools.get(st.name or "")
        if tool is None:
            return []
        top = st.stack[1]
        mode = st.mode
        if mode in ("key_or_end", "key"):
            after = "open" if mode == "key_or_end" else "comma"
            keys = [self._key(st, 2, k, after=after, key_text=tool.key_texts[k])
                    for k in tool.unused(top.keys)]
            if mode == "key_or_end" and tool.closable(top.keys):
                keys.append(self._close(st, 2, empty=True))
            return keys
        if mode == "string" and st.is_key:
            typed = _typed_string(st)
            return [tool.key_texts[k][len(typed):] + ":" + st.style.colon for k in tool.unused(top.keys)
                    if tool.key_texts[k].startswith(typed)]
        if mode == "colon":
            return [":" + st.style.colon]
        if mode == "comma_or_end":
            return self._after_value(st, tool, top.keys)
        values = tool.value(top.key)
        if mode == "value":
            return [self._ws(st, st.style.colon) + v for v in values.openings]
        if mode == "string":
            return [] if values.free_string else values.literals.completions(_typed_string(st)) or []
        if mode == "literal":
            if values.free_number and st.buf[0] in "-0123456789":
                return []  # a free number: more digits may follow
            longer = values.literals.completions(st.buf)
            if longer is None:
                return []
            if st.buf not in values.literals:
                return longer
            return self._after_value(st, tool, top.keys, also=top.key) + longer
        return []

    def expand(self, st: CallState, max_branches: int = 8, max_chars: int = 96) -> list[str]:
        """Text continuations of ``st``: branch at choice points while ``max_branches`` allows, else follow
        the first option; stop where the grammar has no opinion or at ``max_chars``.

        Depth-first, so the most likely branches come first and get the finer branching.
        """
        done: list[str] = []
        stack: list[tuple[CallState, str]] = [(st, "")]
        while stack:
            cur, text = stack.pop()
            opts = self.next_pieces(cur) if len(text) < max_chars else []
            if not opts:
                if text:
                    done.append(text[:max_chars] if len(text) > max_chars else text)
                continue
            room = max_branches - len(done) - len(stack)
            take = opts if len(opts) <= room else opts[:1]
            stack.extend((cur.clone().feed(o), text + o) for o in reversed(take))
        return done


# ----------------------------------------------------------------------------- tokenization


def tokens_in_context(tokenizer, committed: Sequence[int], text: str, tail: int = 8) -> list[int]:
    """Token ids of ``text`` as the target's tokenizer would write it right after ``committed``.

    BPE merges across the boundary, so ``text`` alone may tokenize differently. Encode the decoded last
    ``tail`` committed tokens + ``text``; when that reproduces those committed tokens, the rest is the answer.
    Otherwise (or when the result does not decode back to tail + ``text``) back off to encoding ``text``
    alone, kept only if it decodes back to ``text`` exactly; else nothing (``[]``).

    Example (byte-level toy: one token per byte, plus merges): committed ``b'{"na'`` (4 tokens) and text
    ``me"`` -> encode ``'{"name"'``; if the tokenizer merges ``na``+``me`` into ``name`` the committed
    tokens are not reproduced, so the draft is ``encode('me"')``.
    """
    tail_ids = list(committed[-tail:]) if tail else []
    tail_text = tokenizer.decode(tail_ids) if tail_ids else ""
    ids = tokenizer.encode(tail_text + text, add_special_tokens=False)
    reproduced = ids[: len(tail_ids)] == tail_ids and len(ids) > len(tail_ids)
    if reproduced and tokenizer.decode(ids) == tail_text + text:
        return ids[len(tail_ids):]
    ids = tokenizer.encode(text, add_special_tokens=False)
    if ids and tokenizer.decode(ids) == text:
        return ids
    return []


def proposal_kind(state: CallState) -> str:
    """``open`` (before the body's ``{``), ``call`` (inside the body) or ``after`` (closed, or not a call)."""
    if state.mode == "pre":
        return "open"
    return "after" if state.mode in ("done", "error") else "call"


class SchemaFSMDrafter(Drafter):
    """ToolSpec's schema-aware drafter: grammar-forced pieces of the call, as target tokens.

    Args:
        tokenizer: the target's tokenizer (``encode``/``decode``).
        fmt: a format module from ``ooospec.runtime.formats``.
        tools: OpenAI-style or bare function schemas of the request, as users write them: a tool without a
            string name is skipped and a schema part that cannot be read drafts nothing (never an exception).
        max_branches: most candidate continuations per step.
        max_chars: longest continuation (characters) per candidate.
        openers: initial opening texts, most likely first (default: the format's prefix, bare, fenced);
            pass an earlier drafter's ``grammar.openers`` to keep what its ``observe`` learnt.
    """

    name = "schema_fsm"

    def __init__(self, tokenizer, fmt: ModuleType, tools: list[dict], max_branches: int = 8,
                 max_chars: int = 96, openers: Sequence[str] | None = None):
        self.tokenizer = tokenizer
        self.grammar = CallGrammar(fmt, tools)
        if openers is not None:
            self.grammar.openers = list(openers)
        self.max_branches = max_branches
        self.max_chars = max_chars
        self._last: tuple[str, CallState] = ("", CallState())

    def _state(self, text: str) -> CallState:
        """Parse ``text``, feeding only the new characters when it extends the previous step's text."""
        last_text, last_state = self._last
        if text.startswith(last_text):
            st = last_state.clone().feed(text[len(last_text):])
        else:
            st = parse_state(text)
        self._last = (text, st)
        return st

    def propose_text(self, text: str) -> list[str]:
        """Text continuations of the committed output ``text`` (most likely first)."""
        return self.grammar.expand(self._state(text), self.max_branches, self.max_chars)

    def propose(self, ctx: DraftContext) -> list[list[int]]:
        """Token continuations of the output so far, classed (``proposal_kind``) by where the output stands:
        ``open`` before the call's body (a guess that the target calls a tool at all, and how it opens it),
        ``call`` inside it (keys, punctuation and names the schema forces), ``after`` past it. The budget
        estimates their acceptance apart: an answer that opens with prose must not price the call's own
        structure as a failed guess."""
        generated = list(ctx.generated)
        text = self.tokenizer.decode(generated) if generated else ""
        committed = list(ctx.tokens)
        out: list[list[int]] = []
        conts = self.propose_text(text)
        self.proposal_kind = proposal_kind(self._last[1])
        for cont in conts:
            ids = tokens_in_context(self.tokenizer, committed, cont)
            if ids and ids not in out:
                out.append(ids)
        return out

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Learn how this target opens its calls (tags, fence, layout); the grammar itself is fixed."""
        self.grammar.learn_opener(self.tokenizer.decode(list(output)))
