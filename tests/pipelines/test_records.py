"""Record validation reasons and canonicalization properties."""

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from ooospec.pipelines import records as R
from ooospec.runtime import calls as C


def _rec(params=None, calls=None, tools=None):
    params = params or {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                        "required": ["city"]}
    tools = tools if tools is not None else [R.tool("get_weather", "Weather for a city", params)]
    calls = calls if calls is not None else [R.call("get_weather", {"city": "Paris", "days": 3})]
    return R.make_record("toy", "train", "0", tools, [{"role": "user", "content": "Weather in Paris?"}], calls)


def test_valid_record_passes():
    assert R.validate_record(_rec()) is None


def test_invalid_schema_is_rejected_with_reason():
    bad = {"type": "object", "properties": {"city": {"type": "strin"}}}
    reason, detail = R.validate_record(_rec(params=bad))
    assert reason == R.INVALID_TOOL_SCHEMA and "get_weather" in detail


def test_parameters_must_be_object_schema():
    reason, _ = R.validate_record(_rec(params={"type": "array"}))
    assert reason == R.INVALID_TOOL_SCHEMA


def test_call_to_unknown_tool():
    reason, detail = R.validate_record(_rec(calls=[R.call("get_time", {})]))
    assert reason == R.CALL_UNKNOWN_TOOL and "get_time" in detail


def test_call_schema_violation_names_the_field():
    reason, detail = R.validate_record(_rec(calls=[R.call("get_weather", {"city": "Paris", "days": "3"})]))
    assert reason == R.CALL_SCHEMA_VIOLATION and "days" in detail


def test_missing_required_argument():
    reason, _ = R.validate_record(_rec(calls=[R.call("get_weather", {"days": 2})]))
    assert reason == R.CALL_SCHEMA_VIOLATION


def test_no_gold_call_and_malformed():
    assert R.validate_record(_rec(calls=[]))[0] == R.NO_GOLD_CALL
    rec = _rec()
    rec["messages"] = [{"role": "robot", "content": "hi"}]
    assert R.validate_record(rec)[0] == R.MALFORMED_RECORD
    del rec["tools"]
    assert R.validate_record(rec)[0] == R.MALFORMED_RECORD


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=6), json_values, max_size=5), st.randoms())
def test_canonical_calls_ignore_key_order(args, rnd):
    items = list(args.items())
    rnd.shuffle(items)
    assert C.canonical_calls([R.call("f", args)]) == C.canonical_calls([R.call("f", dict(items))])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="abcXYZ é", min_size=1, max_size=6), min_size=1, max_size=5),
       st.lists(st.sampled_from([" ", "  ", "\t", "\n", "\u00a0"]), min_size=6, max_size=6))
def test_norm_text_ignores_whitespace_and_case(words, seps):
    a = " ".join(words)
    b = seps[0] + "".join(w.upper() + seps[(i + 1) % 6] for i, w in enumerate(words))
    assert C.norm_text(a) == C.norm_text(b)


def test_norm_value_unifies_numbers_and_strings():
    assert C.norm_value({"A": 5.0, "b": [" X  y "]}) == {"a": 5, "b": ["x y"]}
    assert C.canonical_calls([R.call("F", {"n": 5})]) == C.canonical_calls([R.call("f", {"n": 5.0})])
    assert C.canonical_calls([R.call("f", {"n": True})]) != C.canonical_calls([R.call("f", {"n": 1})])


def test_write_jsonl_is_atomic_and_keeps_key_order(tmp_path):
    p = tmp_path / "x" / "out.jsonl"
    assert R.write_jsonl(p, [{"b": 1, "a": "é"}]) == 1
    assert p.read_text(encoding="utf-8") == '{"b":1,"a":"é"}\n'
    assert [q.name for q in p.parent.iterdir()] == ["out.jsonl"]   # no temp file left behind
    assert list(R.read_jsonl(p)) == [json.loads('{"a":"é","b":1}')]


def test_read_jsonl_names_the_bad_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"a": 1}\n{oops\n')
    try:
        list(R.read_jsonl(p))
    except ValueError as e:
        assert "bad.jsonl:2" in str(e)
    else:
        raise AssertionError("expected ValueError")


def test_reject_to_json_keeps_unserializable_raw():
    rej = R.Reject("s", "sp", "7", "unparseable_call", "x", raw={"obj": object()})
    d = rej.to_json()
    assert d["id"] == "s/sp/7" and isinstance(d["raw"]["obj"], str)
    json.dumps(d)


def test_keys_that_normalize_alike_give_one_form_in_any_order():
    """"\\r" and "\\x0c" both normalize to "" (as "City" and "city" to "city"): which value stands must not depend
    on the order the object came in (found by the property above)."""
    args = {"0": None, "\r": None, "\x0c": []}
    for order in (list(args.items()), list(reversed(args.items())), sorted(args.items(), key=lambda kv: kv[1] is None)):
        assert C.canonical_calls([R.call("f", dict(order))]) == C.canonical_calls([R.call("f", args)])
    assert C.canonical_calls([R.call("f", {"City": "a", "city": "b"})]) == C.canonical_calls(
        [R.call("f", {"city": "b", "City": "a"})])
