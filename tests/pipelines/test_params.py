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
    assert P.load_section(IngestParams, "ingest", path).source == "../shared/datasets"
    P.load_section(DedupeParams, "dedupe", path)
