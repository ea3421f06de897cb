"""Schema-aware drafting (ToolSpec): a JSON-call grammar state machine built from the tools' JSON Schemas.

The committed output text is fed through ``CallState`` (an incremental JSON-prefix parser that knows which
part of ``{"name": ..., "arguments": {...}}`` it is in). ``next_pieces`` lists the legal next text pieces
(most likely first): the fixed punctuation, every tool name consistent with the typed prefix, unused argument
keys (required first), enum / boolean values, the call suffix. Free-form values (strings without enum,
numbers, nested containers) get nothing: other drafters handle those.

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

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType

from ooospec.runtime.drafting import DraftContext
from ooospec.runtime.formats.common import function_schemas

_WS = " \t\n\r"
_LITERAL_CHARS = set("+-.0123456789eEtruefalsn")
_FENCE = "```json\n"


@dataclass
class _Frame:
    """One open JSON container. ``keys``: completed keys (objects); ``key``: key whose value is being read."""

    kind: str                       # "{" or "["
    keys: list[str] = field(default_factory=list)
    key: str | None = None


@dataclass
class Style:
    """Whitespace layout: ``indent=None`` is inline (``comma``/``colon`` after the punctuation)."""

    indent: int | None = None
    comma: str = " "
    colon: str = " "

    def newline(self, depth: int) -> str:
        """Whitespace before an item (or closer) at container depth ``depth`` (1 = call object)."""
        return "" if self.indent is None else "\n" + " " * (self.indent * depth)


class CallState:
    """Incremental parser of one call's text: the text before the JSON body, the body, the text after.

    Modes: ``pre`` (before the first ``{``), ``value``, ``key_or_end``, ``key``, ``colon``, ``comma_or_end``,
    ``arr_value_or_end``, ``string``, ``literal``, ``done`` (body closed; ``after`` collects the rest),
    ``error`` (not a JSON call; nothing is drafted).
    """

    def __init__(self) -> None:
        self.mode = "pre"
        self.stack: list[_Frame] = []
        self.buf = ""          # string content / literal characters typed so far
        self.is_key = False    # the open string is a key
        self.esc = False
        self.ws = ""           # whitespace typed since the last significant character
        self.pre = ""
        self.after = ""
        self.name: str | None = None  # the call's "name" value once it is closed
        self.style = Style()
        self.known: set[str] = set()  # style fields actually observed
        self._prev = ""        # last significant character (for style inference)

    def clone(self) -> CallState:
        new = CallState.__new__(CallState)
        new.__dict__.update(self.__dict__)
        new.stack = [_Frame(f.kind, list(f.keys), f.key) for f in self.stack]
        new.style = Style(self.style.indent, self.style.comma, self.style.colon)
        new.known = set(self.known)
        return new

    # -------------------------------------------------------------------------------- feeding

    def feed(self, text: str) -> CallState:
        for c in text:
            if self.mode == "error":
                break
            self._feed_char(c)
        return self

    def _learn_style(self) -> None:
        """Record the whitespace just typed after ``{`` / ``,`` / ``:`` as the layout of this output."""
        if self._prev in ("{", ",") and "indent" not in self.known and "\n" in self.ws:
            self.style.indent = len(self.ws) - self.ws.rfind("\n") - 1
            if self.style.indent and len(self.stack) > 1:
                self.style.indent //= len(self.stack)
            self.known.add("indent")
        elif self._prev == "{" and "indent" not in self.known:
            self.style.indent = None
            self.known.add("indent")
        elif self._prev == "," and "\n" not in self.ws and "comma" not in self.known:
            self.style.comma = self.ws
            self.known.add("comma")
        elif self._prev == ":" and "colon" not in self.known:
            self.style.colon = self.ws
            self.known.add("colon")

    def _significant(self, c: str) -> None:
        self._learn_style()
        self.ws = ""
        self._prev = c

    def _value_done(self) -> None:
        if not self.stack:
            self.mode = "done"
            return
        top = self.stack[-1]
        if top.kind == "{":
            top.keys.append(top.key)
        self.mode = "comma_or_end"

    def _start_value(self, c: str) -> None:
        if c == '"':
            self.mode, self.buf, self.is_key = "string", "", False
        elif c in "{[":
            self.stack.append(_Frame(c))
            self.mode = "key_or_end" if c == "{" else "arr_value_or_end"
        elif c in _LITERAL_CHARS:
            self.mode, self.buf = "literal", c
        else:
            self.mode = "error"

    def _feed_char(self, c: str) -> None:
        mode = self.mode
        if mode == "pre":
            if c == "{":
                self._significant(c)
                self._start_value(c)
            else:
                self.pre += c
            return
        if mode == "done":
            self.after += c
            return
        if mode == "string":
            if self.esc:
                self.buf += {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}.get(c, c)
                self.esc = False
            elif c == "\\":
                self.esc = True
            elif c == '"':
                self._prev = c
                if self.is_key:
                    self.stack[-1].key = self.buf
                    self.mode = "colon"
                else:
                    if len(self.stack) == 1 and self.stack[0].key == "name":
                        self.name = self.buf
                    self._value_done()
            else:
                self.buf += c
            return
        if mode == "literal":
            if c in _LITERAL_CHARS:
                self.buf += c
                return
            self._value_done()
            mode = self.mode
        if c in _WS:
            self.ws += c
            return
        self._significant(c)
        top = self.stack[-1] if self.stack else None
        if mode in ("value", "arr_value_or_end"):
            if mode == "arr_value_or_end" and c == "]":
                self.stack.pop()
                self._value_done()
            else:
                self._start_value(c)
        elif mode in ("key_or_end", "key"):
            if c == '"':
                self.mode, self.buf, self.is_key = "string", "", True
            elif c == "}" and mode == "key_or_end":
                self.stack.pop()
                self._value_done()
            else:
                self.mode = "error"
        elif mode == "colon":
            self.mode = "value" if c == ":" else "error"
        elif mode == "comma_or_end":
            if c == ",":
                self.mode = "key" if top.kind == "{" else "value"
            elif c == ("}" if top.kind == "{" else "]"):
                self.stack.pop()
                self._value_done()
            else:
                self.mode = "error"


def parse_state(text: str) -> CallState:
    """The ``CallState`` after reading ``text`` from its start."""
    return CallState().feed(text)


# ------------------------------------------------------------------------------------ grammar


def _ordered_keys(params: dict, used: list[str]) -> list[str]:
    """Unused argument keys: required ones first, each group in ``properties`` order."""
    props = list(params.get("properties", {}))
    required = [k for k in params.get("required", [])]
    req = [k for k in props if k in required] + [k for k in required if k not in props]
    return [k for k in req + [k for k in props if k not in required] if k not in used]


def _literal_values(prop: dict) -> list[str]:
    """The finitely many JSON texts a value may take (enum / boolean / null), or [] when free."""
    if "enum" in prop:
        return [json.dumps(v, ensure_ascii=False) for v in prop["enum"]]
    if "const" in prop:
        return [json.dumps(prop["const"], ensure_ascii=False)]
    kind = prop.get("type")
    if kind == "boolean":
        return ["true", "false"]
    if kind == "null":
        return ["null"]
    return []


def _value_starts(prop: dict | None) -> list[str]:
    """How a value of this schema may begin: its literal values, or the opening quote/bracket."""
    if prop is None:
        return []
    literals = _literal_values(prop)
    if literals:
        return literals
    return {"string": ['"'], "object": ["{"], "array": ["["]}.get(prop.get("type"), [])


class CallGrammar:
    """The legal next text pieces of a call, given the tools, the format and the output's style."""

    def __init__(self, fmt: ModuleType, tools: list[dict]):
        self.fmt = fmt
        self.tools = {fn["name"]: fn for fn in function_schemas(tools)}
        self.names = list(self.tools)
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

    def _key(self, st: CallState, depth: int, key: str, after: str) -> str:
        """Text up to and including ``"key": `` for an object at ``depth`` (1 = the call object).

        ``after`` is where the text stands: ``"open"`` (just after ``{``), ``"comma"`` (just after ``,``),
        ``"value"`` (a value just ended, so the comma is part of the piece).
        """
        if st.style.indent is not None:
            sep = st.style.newline(depth)
        else:
            sep = "" if after == "open" else st.style.comma
        head = "," + sep if after == "value" else self._ws(st, sep)
        return head + json.dumps(key, ensure_ascii=False) + ":" + st.style.colon

    def _close(self, st: CallState, depth: int, empty: bool = False) -> str:
        """Text closing the object at ``depth``; an empty object closes right away (``{}``)."""
        return "}" if empty else self._ws(st, st.style.newline(depth - 1)) + "}"

    def next_pieces(self, st: CallState) -> list[str]:
        """Legal next text pieces after ``st``, most likely first; [] where the grammar does not decide."""
        if st.mode == "error":
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
            return [self._key(st, 1, remaining[0], after="open" if mode == "key_or_end" else "comma")]
        if mode == "string" and st.is_key:  # one key only: name first, as every format writes it
            return [k[len(st.buf):] + '":' + st.style.colon for k in remaining if k.startswith(st.buf)][:1]
        if mode == "colon":
            return [":" + st.style.colon]
        if mode == "value":
            start = {"name": '"', self.fmt.args_key: "{"}.get(top.key)
            return [self._ws(st, st.style.colon) + start] if start else []
        if mode == "string" and top.key == "name":
            return [n[len(st.buf):] + '"' for n in self.names if n.startswith(st.buf)]
        if mode == "comma_or_end":
            if remaining:
                return [self._key(st, 1, remaining[0], after="value")]
            return [self._close(st, 1)]
        return []

    def _args_level(self, st: CallState) -> list[str]:
        tool = self.tools.get(st.name or "")
        if tool is None:
            return []
        params = tool.get("parameters") or {}
        props = params.get("properties", {})
        top = st.stack[1]
        unused = _ordered_keys(params, top.keys)
        closable = all(k in top.keys for k in params.get("required", []))
        mode = st.mode
        if mode == "key_or_end":
            keys = [self._key(st, 2, k, after="open") for k in unused]
            return keys + [self._close(st, 2, empty=True)] if closable else keys
        if mode == "key":
            return [self._key(st, 2, k, after="comma") for k in unused]
        if mode == "string" and st.is_key:
            return [k[len(st.buf):] + '":' + st.style.colon for k in unused if k.startswith(st.buf)]
        if mode == "colon":
            return [":" + st.style.colon]
        prop = props.get(top.key)
        if mode == "value":
            return [self._ws(st, st.style.colon) + v for v in _value_starts(prop)]
        if mode == "string":
            literals = [v[1:] for v in _literal_values(prop or {}) if v.startswith('"')]
            return [v[len(st.buf):] for v in literals if v.startswith(st.buf)]
        if mode == "literal":
            literals = _literal_values(prop or {})
            if st.buf not in literals:
                return [v[len(st.buf):] for v in literals if v.startswith(st.buf)]
            unused = [k for k in unused if k != top.key]  # the literal is complete but not closed yet
            closable = all(k in top.keys or k == top.key for k in params.get("required", []))
            keys = [self._key(st, 2, k, after="value") for k in unused]
            return ([self._close(st, 2)] + keys) if closable else keys
        if mode == "comma_or_end":
            keys = [self._key(st, 2, k, after="value") for k in unused]
            return ([self._close(st, 2)] + keys) if closable else keys
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


class SchemaFSMDrafter:
    """ToolSpec's schema-aware drafter: grammar-forced pieces of the call, as target tokens.

    Args:
        tokenizer: the target's tokenizer (``encode``/``decode``).
        fmt: a format module from ``ooospec.runtime.formats``.
        tools: OpenAI-style or bare function schemas of the request.
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
        generated = list(ctx.generated)
        text = self.tokenizer.decode(generated) if generated else ""
        committed = list(ctx.tokens)
        out: list[list[int]] = []
        for cont in self.propose_text(text):
            ids = tokens_in_context(self.tokenizer, committed, cont)
            if ids and ids not in out:
                out.append(ids)
        return out

    def observe(self, prompt: Sequence[int], output: Sequence[int]) -> None:
        """Learn how this target opens its calls (tags, fence, layout); the grammar itself is fixed."""
        self.grammar.learn_opener(self.tokenizer.decode(list(output)))
