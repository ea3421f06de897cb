"""Where a call's text stands: an incremental JSON-prefix parser of one ``{"name": ..., "arguments": {...}}`` call.

``CallState`` reads the committed output one character at a time and keeps what the grammar
(:mod:`ooospec.runtime.drafters.schema_fsm`) needs to list the legal next pieces: the parser mode, the open containers
with their completed keys, the string or literal being typed, the text before the body and after it, and the whitespace
style seen so far::

    >>> st = parse_state('<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Par')
    >>> st.mode, st.buf, st.name, st.pre, [f.key for f in st.stack]
    ('string', 'Par', 'get_weather', '<tool_call>\\n', ['arguments', 'city'])

Each mode has one small handler. Text modes take any character as content (``pre``, ``string``, ``literal``,
``done``); punctuation modes skip whitespace (learning the layout from it) and take one JSON token (``value``,
``arr_value_or_end``, ``key_or_end``, ``key``, ``colon``, ``comma_or_end``). A character no handler accepts puts
the state in ``error``: not a JSON call, nothing is drafted.
"""

from __future__ import annotations

from dataclasses import dataclass, field

_WS = " \t\n\r"
_LITERAL_CHARS = set("+-.0123456789eEtruefalsn")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "b": "\b", "f": "\f"}
MAX_BUF = 1024          # string / literal characters kept per value; longer ones get no drafts
MAX_KEPT = 256          # whitespace, text before the body and text after it: what style/suffix logic needs


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
        self.buf = ""          # string content / literal characters typed so far (at most MAX_BUF)
        self.buf_full = False  # the value outgrew MAX_BUF: nothing is drafted inside it
        self.is_key = False    # the open string is a key
        self.esc = False
        self.uhex: str | None = None  # hex digits of a \uXXXX escape being typed
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

    def feed(self, text: str) -> CallState:
        for c in text:
            if self.mode == "error":
                break
            self._feed_char(c)
        return self

    def _feed_char(self, c: str) -> None:
        text_mode = _TEXT_MODES.get(self.mode)
        if text_mode is not None:
            text_mode(self, c)
        else:
            self._feed_punct(c)

    # ---------------------------------------------------------------------------- shared steps

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

    def _append(self, c: str) -> None:
        if len(self.buf) < MAX_BUF:
            self.buf += c
        else:
            self.buf_full = True

    def _open_string(self, is_key: bool) -> None:
        self.mode, self.buf, self.buf_full, self.is_key = "string", "", False, is_key

    def _value_done(self) -> None:
        if not self.stack:
            self.mode = "done"
            return
        top = self.stack[-1]
        if top.kind == "{":
            top.keys.append(top.key)
        self.mode = "comma_or_end"

    def _close_container(self) -> None:
        self.stack.pop()
        self._value_done()

    def _start_value(self, c: str) -> None:
        if c == '"':
            self._open_string(is_key=False)
        elif c in "{[":
            self.stack.append(_Frame(c))
            self.mode = "key_or_end" if c == "{" else "arr_value_or_end"
        elif c in _LITERAL_CHARS:
            self.mode, self.buf, self.buf_full = "literal", c, False
        else:
            self.mode = "error"

    # ---------------------------------------------------------------------------- text modes

    def _feed_pre(self, c: str) -> None:
        if c == "{":
            self._significant(c)
            self._start_value(c)
            return
        self.pre += c
        if len(self.pre) > 2 * MAX_KEPT:  # only its tail matters (tags, fence, opener in progress)
            self.pre = self.pre[-MAX_KEPT:]

    def _feed_after(self, c: str) -> None:
        if len(self.after) <= MAX_KEPT:  # longer than any suffix already
            self.after += c

    def _feed_string(self, c: str) -> None:
        if self.uhex is not None:
            self._feed_uhex(c)
        elif self.esc:
            if c == "u":
                self.uhex = ""
            else:
                self._append(_ESCAPES.get(c, c))
            self.esc = False
        elif c == "\\":
            self.esc = True
        elif c == '"':
            self._close_string()
        else:
            self._append(c)

    def _feed_uhex(self, c: str) -> None:
        if c not in "0123456789abcdefABCDEF":
            self.mode = "error"
            return
        self.uhex += c
        if len(self.uhex) == 4:
            self._append(chr(int(self.uhex, 16)))
            self.uhex = None

    def _close_string(self) -> None:
        self._prev = '"'
        if self.is_key:
            self.stack[-1].key = None if self.buf_full else self.buf
            self.mode = "colon"
            return
        if len(self.stack) == 1 and self.stack[0].key == "name" and not self.buf_full:
            self.name = self.buf
        self._value_done()

    def _feed_literal(self, c: str) -> None:
        if c in _LITERAL_CHARS:
            self._append(c)
            return
        self._value_done()      # the character after a literal is punctuation (or whitespace)
        self._feed_punct(c)

    # ---------------------------------------------------------------------------- punctuation modes

    def _feed_punct(self, c: str) -> None:
        if c in _WS:
            if len(self.ws) < MAX_KEPT:
                self.ws += c
            return
        self._significant(c)
        punct_mode = _PUNCT_MODES.get(self.mode)
        if punct_mode is not None:
            punct_mode(self, c)

    def _expect_value(self, c: str) -> None:
        if self.mode == "arr_value_or_end" and c == "]":
            self._close_container()
        else:
            self._start_value(c)

    def _expect_key(self, c: str) -> None:
        if c == '"':
            self._open_string(is_key=True)
        elif c == "}" and self.mode == "key_or_end":
            self._close_container()
        else:
            self.mode = "error"

    def _expect_colon(self, c: str) -> None:
        self.mode = "value" if c == ":" else "error"

    def _expect_comma_or_end(self, c: str) -> None:
        top = self.stack[-1]
        if c == ",":
            self.mode = "key" if top.kind == "{" else "value"
        elif c == ("}" if top.kind == "{" else "]"):
            self._close_container()
        else:
            self.mode = "error"


# The handler of each mode: text modes take the character as content, punctuation modes after the whitespace.
_TEXT_MODES = {"pre": CallState._feed_pre, "done": CallState._feed_after, "string": CallState._feed_string,
               "literal": CallState._feed_literal}
_PUNCT_MODES = {"value": CallState._expect_value, "arr_value_or_end": CallState._expect_value,
                "key_or_end": CallState._expect_key, "key": CallState._expect_key,
                "colon": CallState._expect_colon, "comma_or_end": CallState._expect_comma_or_end}


def parse_state(text: str) -> CallState:
    """The ``CallState`` after reading ``text`` from its start."""
    return CallState().feed(text)
