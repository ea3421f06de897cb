"""Canonical call keys: one canonicalization, shared by the tool cache and the dedupe stage."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ooospec.pipelines import dedupe, records
from ooospec.runtime import calls as C

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=80, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=5), st.randoms(),
       st.sampled_from([None, 2, "\t"]), st.sampled_from([(",", ":"), (", ", ": "), (" ,", " : ")]))
def test_key_ignores_key_order_and_json_whitespace(args, rnd, indent, separators):
    items = list(args.items())
    rnd.shuffle(items)
    text = json.dumps(dict(items), indent=indent, separators=separators)   # as a model might write it
    assert C.call_key({"name": "f", "arguments": args}) == C.call_key({"name": "f", "arguments": json.loads(text)})


def test_key_unifies_number_forms_but_keeps_strings_and_booleans():
    key = C.call_key({"name": "f", "arguments": {"n": 5, "xs": [1, 2.5]}})
    for same in ({"n": 5.0, "xs": [1.0, 2.5]}, json.loads('{"xs": [1e0, 25e-1], "n": 5E0}')):
        assert C.call_key({"name": "f", "arguments": same}) == key
    assert C.call_key({"name": "f", "arguments": {"n": True}}) != C.call_key({"name": "f", "arguments": {"n": 1}})
    assert C.call_key({"name": "f", "arguments": {"n": None}}) != C.call_key({"name": "f", "arguments": {}})
    # strings are exact: a case-sensitive tool may treat these as different calls
    assert (C.call_key({"name": "f", "arguments": {"s": "Paris"}})
            != C.call_key({"name": "f", "arguments": {"s": "paris"}}))
    assert C.call_key({"name": "f", "arguments": {"s": "a  b"}}) != C.call_key({"name": "f", "arguments": {"s": "a b"}})
    assert C.call_key({"name": "F", "arguments": {}}) != C.call_key({"name": "f", "arguments": {}})


def test_key_rejects_malformed_calls_naming_the_field():
    with pytest.raises(TypeError, match="call.name"):
        C.call_key({"arguments": {}})
    with pytest.raises(TypeError, match="arguments must be an object"):
        C.call_key({"name": "f", "arguments": "[1]"})


def test_one_canonicalization_shared_with_the_pipeline():
    """The dedupe stage imports the runtime's functions (no second copy, no re-export), and the exact key is the
    normalized form minus the string folding."""
    for name in ("norm_text", "canonical_json", "canonical_calls"):
        assert getattr(dedupe, name) is getattr(C, name)
    assert not any(hasattr(records, n) for n in ("norm_text", "norm_value", "canonical_calls"))   # no re-export
    args = {"B": 5.0, "a": [" X  y ", 2.0]}
    assert C.norm_value(args) == C.canonical_value(args, C.norm_text) == {"b": 5, "a": ["x y", 2]}
    assert C.canonical_value(args) == {"B": 5, "a": [" X  y ", 2]}
