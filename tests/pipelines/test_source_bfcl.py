"""BFCL v4 parser: one test per quirk (datasets README §5, §7-BFCL), on real excerpts in tests/fixtures/bfcl."""

import json
import shutil
from pathlib import Path

import pytest

from ooospec.pipelines import records as R
from ooospec.pipelines.sources import bfcl as B
from ooospec.runtime import calls as C

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "bfcl"


@pytest.fixture(scope="module")
def parsed():
    return list(B.parse(ROOT))


@pytest.fixture(scope="module")
def by_id(parsed):
    return {r["id"]: r for r in parsed if isinstance(r, dict)}


def _lines(rel: str) -> list[dict]:
    return [json.loads(line) for line in (ROOT / rel).read_text(encoding="utf-8").splitlines() if line.strip()]


def _props(rec, i=0):
    return rec["tools"][i]["function"]["parameters"]["properties"]


# ---------------------------------------------------------------- whole-fixture properties

def test_every_question_becomes_a_valid_record(parsed):
    assert not [r for r in parsed if isinstance(r, R.Reject)]
    bad = [(r["id"], R.validate_record(r)) for r in parsed if R.validate_record(r) is not None]
    assert bad == []
    for split, (fname, _) in B.SPLITS.items():   # one record per question line, in file order
        want = [f"bfcl/{split}/{q['id']}" for q in _lines(fname)]
        assert [r["id"] for r in parsed if r["split"] == split] == want


def test_ids_unique_stable_and_output_deterministic(parsed):
    ids = [r["id"] for r in parsed]
    assert len(ids) == len(set(ids))
    assert C.canonical_json(parsed) == C.canonical_json(list(B.parse(ROOT)))


def test_files_are_json_lines_and_every_message_is_kept(by_id):
    q = _lines("BFCL_v4_simple_python.json")[0]
    rec = by_id[f"bfcl/simple-python/{q['id']}"]
    assert rec["messages"] == [m for turn in q["question"] for m in turn]


# ---------------------------------------------------------------- schemas

def test_convert_schema_maps_types_recursively():
    src = {"type": "dict", "required": ["a"], "properties": {
        "a": {"type": "float", "description": "x"},
        "b": {"type": "tuple", "items": {"type": "float"}},
        "c": {"type": "any"},
        "d": {"type": "array", "items": {"type": "dict", "properties": {"e": {"type": "integer"}}}},
        "f": {"type": "boolean", "optional": True, "default": True}}}
    out = B.convert_schema(src)
    assert out["type"] == "object" and out["required"] == ["a"]
    assert out["properties"]["a"] == {"type": "number", "description": "x"}
    assert out["properties"]["b"] == {"type": "array", "items": {"type": "number"}}
    assert out["properties"]["c"] == {}
    assert out["properties"]["d"]["items"] == {"type": "object", "properties": {"e": {"type": "integer"}}}
    assert out["properties"]["f"] == {"type": "boolean", "default": True}      # non-standard "optional" dropped
    with pytest.raises(B.UnsupportedType):
        B.convert_schema({"type": "dict", "properties": {"x": {"type": "complex"}}})


def test_tuple_and_any_parameters_in_real_docs(by_id):
    assert _props(by_id["bfcl/simple-python/simple_python_83"])["coord1"]["type"] == "array"     # tuple
    assert "type" not in _props(by_id["bfcl/simple-python/simple_python_109"])["data"]          # any
    assert all(t["function"]["parameters"]["type"] == "object" for r in by_id.values() for t in r["tools"])


def test_language_hint_appended_like_bfcl(by_id):
    fn = _lines("BFCL_v4_simple_java.json")[0]["function"][0]
    tool = by_id["bfcl/simple-java/simple_java_0"]["tools"][0]["function"]
    assert tool["description"] == fn["description"] + B.LANGUAGE_HINT["java"]
    assert by_id["bfcl/parallel/parallel_0"]["tools"][0]["function"]["description"].endswith("Python 3 syntax.")


# ---------------------------------------------------------------- gold calls from possible_answer

def test_first_non_empty_allowed_value_is_gold(by_id):
    # "unit": ["units", ""]  and  "z": ["", 0]
    assert by_id["bfcl/simple-python/simple_python_0"]["calls"][0]["arguments"] == \
        {"base": 10, "height": 5, "unit": "units"}
    assert by_id["bfcl/simple-python/simple_python_2"]["calls"][0]["arguments"]["z"] == 0


def test_parameter_omitted_when_no_allowed_value_fits(by_id):
    # simple_python_307 "venue": ["", true] for a string parameter; parallel_152 "mod": ["", null] for a number
    assert "venue" not in by_id["bfcl/simple-python/simple_python_307"]["calls"][0]["arguments"]
    assert all("mod" not in c["arguments"] for c in by_id["bfcl/parallel/parallel_152"]["calls"])


def test_pick_value_rules():
    assert B.pick_value([""], {"type": "string"}) == (False, None)
    assert B.pick_value(["", "x"], {"type": "string"}) == (True, "x")
    assert B.pick_value(["5", 5], {"type": "integer"}) == (True, 5)          # type-violating value skipped
    assert B.pick_value(["5"], {"type": "integer"}) == (True, "5")           # nothing fits: kept, validation rejects
    assert B.pick_value([3], {"type": "number"}) == (True, 3)                # int is a JSON Schema number


def test_list_values_wrapped_once_more_are_unwrapped(by_id):
    # multiple_3: "pointA": [[3, 4]]
    assert by_id["bfcl/multiple/multiple_3"]["calls"][0]["arguments"]["pointA"] == [3, 4]


def test_dict_values_are_allowed_maps_resolved_recursively(by_id):
    args = by_id["bfcl/simple-python/simple_python_89"]["calls"][0]["arguments"]
    assert args["conditions"] == {"department": "Science", "school": "Bluebird High School"}
    conds = by_id["bfcl/simple-python/simple_python_96"]["calls"][0]["arguments"]["conditions"]
    assert conds == [{"field": "age", "operation": ">", "value": "25"},
                     {"field": "job", "operation": "=", "value": "engineer"}]


def test_allowed_values_kept_verbatim_in_meta(by_id):
    for split, (fname, _) in B.SPLITS.items():
        for a in _lines(f"possible_answer/{fname}"):
            assert by_id[f"bfcl/{split}/{a['id']}"]["meta"]["allowed"] == a["ground_truth"]


def test_parallel_gives_one_call_per_ground_truth_entry_and_dotted_names_kept(by_id):
    rec = by_id["bfcl/parallel/parallel_0"]
    assert [c["name"] for c in rec["calls"]] == ["spotify.play", "spotify.play"]
    assert [c["arguments"]["artist"] for c in rec["calls"]] == ["Taylor Swift", "Maroon 5"]
    assert rec["tools"][0]["function"]["name"] == "spotify.play"


# ---------------------------------------------------------------- Java / JavaScript

def test_java_js_parameters_are_strings_with_bfcl_suffix(by_id):
    recs = [r for r in by_id.values() if r["meta"]["language"] != "python"]
    assert recs
    for r in recs:
        for p in _props(r).values():
            assert p["type"] == "string" and "in string representation." in p["description"]
        assert all(isinstance(v, str) for c in r["calls"] for v in c["arguments"].values())
    assert "items" not in _props(by_id["bfcl/simple-java/simple_java_22"])["ids"]
    ids = _props(by_id["bfcl/simple-java/simple_java_22"])["ids"]
    assert "The list elements are of type long" in ids["description"]


def test_java_gold_is_source_code(by_id):
    assert by_id["bfcl/simple-java/simple_java_25"]["calls"][0]["arguments"] == {"id": "42L", "sort": "5"}
    args = by_id["bfcl/simple-java/simple_java_1"]["calls"][0]["arguments"]
    assert args["useShortName"] == "true"
    assert args["params"] == 'new HashMap<String, Object>() {{ put("limit", 50); put("schemaFilter", "public"); }}'
    assert by_id["bfcl/simple-java/simple_java_22"]["calls"][0]["arguments"]["ids"] == \
        "new ArrayList<>(Arrays.asList(101L, 202L, 303L))"
    assert by_id["bfcl/simple-java/simple_java_0"]["calls"][0]["arguments"]["controller"] == "mapController"
    assert B.java_source(["a"], {"type": "Array", "items": {"type": "String"}}) == 'new String[]{"a"}'
    assert B.java_source(2, {"type": "double"}) == "2.0"
    assert B.java_source(2.5, {"type": "float"}) == "2.5f"


def test_js_gold_is_source_code_that_decodes_to_an_allowed_value(by_id):
    rec = by_id["bfcl/simple-javascript/simple_javascript_5"]
    (allowed,) = rec["meta"]["allowed"]
    for p, v in rec["calls"][0]["arguments"].items():
        typed = json.loads(v) if v[:1] in "[{" else v
        assert typed == B.resolve_allowed(allowed["manageReactState"][p][0])
    assert by_id["bfcl/simple-javascript/simple_javascript_0"]["calls"][0]["arguments"]["isComplete"] == "true"


# ---------------------------------------------------------------- rejects

def test_question_without_answer_is_rejected_naming_the_file(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    ans = root / "possible_answer" / "BFCL_v4_parallel.json"
    lines = ans.read_text(encoding="utf-8").splitlines(keepends=True)
    ans.write_text("".join(lines[1:]), encoding="utf-8")
    rejects = [r for r in B.parse(root) if isinstance(r, R.Reject)]
    assert [(r.split, r.local_id, r.reason) for r in rejects] == [("parallel", "parallel_0", B.MISSING_ANSWER)]
    assert "BFCL_v4_parallel.json" in rejects[0].detail


def test_unknown_type_is_rejected(tmp_path):
    root = tmp_path / "raw"
    shutil.copytree(ROOT, root)
    q = root / "BFCL_v4_multiple.json"
    rows = _lines("BFCL_v4_multiple.json")
    rows[0]["function"][0]["parameters"]["properties"]["side1"]["type"] = "complex"
    q.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    rejects = [r for r in B.parse(root) if isinstance(r, R.Reject)]
    assert [(r.local_id, r.reason) for r in rejects] == [(rows[0]["id"], B.UNSUPPORTED_TYPE)]
