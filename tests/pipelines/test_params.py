from dataclasses import dataclass
from pathlib import Path

import pytest

from ooospec.pipelines import params as P
from ooospec.pipelines.dedupe import DedupeParams
from ooospec.pipelines.ingest import IngestParams


@dataclass(frozen=True)
class Toy:
    lr: float = 1e-3
    names: tuple[str, ...] = ("a",)


def test_unknown_key_is_an_error():
    with pytest.raises(ValueError, match="unknown key.*'lrr'"):
        P.from_dict(Toy, {"lrr": 1}, "toy")


def test_coercion_and_defaults():
    t = P.from_dict(Toy, {"lr": 1, "names": ["x", "y"]}, "toy")
    assert t == Toy(lr=1.0, names=("x", "y")) and isinstance(t.lr, float)
    assert P.from_dict(Toy, None) == Toy()


def test_committed_params_sections_load():
    path = Path(__file__).parents[2] / "params.yaml"
    ingest = P.load_section(IngestParams, "ingest", path)
    assert (ingest.source, ingest.mirror) == ("auto", None)     # a clone downloads what this workspace has beside it
    P.load_section(DedupeParams, "dedupe", path)


@dataclass(frozen=True)
class Typed:
    n: int = 1
    cap: int | None = None
    flag: bool = False
    name: str = "x"


@pytest.mark.parametrize("bad, match", [({"n": "8"}, "toy.n must be an integer"), ({"n": True}, "integer"),
                                        ({"cap": "3"}, "toy.cap"), ({"flag": "yes"}, "true/false"),
                                        ({"name": 3}, "string"), ({"n": 1.5}, "integer")])
def test_coercion_is_strict_and_names_the_key(bad, match):
    with pytest.raises(ValueError, match=match):
        P.from_dict(Typed, bad, "toy")
    assert P.from_dict(Typed, {"cap": None, "n": 2}, "toy") == Typed(n=2)
