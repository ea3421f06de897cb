"""A GGUF file's tensor table (name, element count, stored bytes, dimensions), read without parsing its metadata.

``gguf.GGUFReader`` builds a numpy view for every metadata value, the tokenizer's ~150k vocabulary strings
included: 15-20 s per file on 2 cores, once for every bench cell on a llama.cpp target. The table itself is a few
hundred records after the metadata, so this reader steps over the metadata values by their lengths (GGUF v2/v3,
little-endian) and reads the tensor records; byte sizes come from gguf's block table (``GGML_QUANT_SIZES``).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass

# GGUF value types -> fixed byte width (8: string, 9: array are variable)
_WIDTH = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    n_elements: int
    n_bytes: int
    n_dims: int


class _Cursor:
    def __init__(self, buf, path):
        self.buf, self.pos, self.path = buf, 0, path

    def unpack(self, fmt: str):
        try:
            values = struct.unpack_from("<" + fmt, self.buf, self.pos)
        except struct.error:
            raise ValueError(f"{self.path}: truncated GGUF (ends inside a record at byte {self.pos})") from None
        self.pos += struct.calcsize("<" + fmt)
        return values if len(values) > 1 else values[0]

    def string(self) -> bytes:
        n = self.unpack("Q")
        if self.pos + n > len(self.buf):
            raise ValueError(f"{self.path}: a string of {n} bytes runs past the end of the file at byte {self.pos}")
        s = self.buf[self.pos:self.pos + n]
        self.pos += n
        return s

    def skip_value(self, vtype: int) -> None:
        if vtype in _WIDTH:
            self.pos += _WIDTH[vtype]
        elif vtype == _STRING:
            n = self.unpack("Q")   # not `self.pos += self.unpack(...)`: that adds to the position before the read
            self.pos += n
        elif vtype == _ARRAY:
            etype, count = self.unpack("IQ")
            if etype in _WIDTH:
                self.pos += _WIDTH[etype] * count
            else:
                for _ in range(count):
                    self.skip_value(etype)
        else:
            raise ValueError(f"{self.path}: unknown GGUF value type {vtype} at byte {self.pos}")


def tensor_table(path: str | os.PathLike) -> dict[str, TensorInfo]:
    """Every tensor of the GGUF at ``path`` by name. Raises ValueError on a file that is not GGUF v2/v3 or a
    tensor type gguf does not know."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        cur = _Cursor(buf, path)
        magic, version = cur.unpack("4sI")
        if magic != b"GGUF" or version not in (2, 3):
            raise ValueError(f"{path}: not a GGUF v2/v3 file (magic {magic!r}, version {version})")
        n_tensors, n_kv = cur.unpack("QQ")
        for _ in range(n_kv):
            cur.string()
            cur.skip_value(cur.unpack("I"))
        table = {}
        for _ in range(n_tensors):
            name = cur.string().decode("utf-8", errors="replace")
            n_dims = cur.unpack("I")
            dims = [cur.unpack("Q") for _ in range(n_dims)]
            ggml_type, _offset = cur.unpack("IQ")
            try:
                block, type_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
            except (ValueError, KeyError):
                raise ValueError(f"{path}: tensor {name!r} has a type gguf does not know ({ggml_type})") from None
            n = 1
            for d in dims:
                n *= d
            table[name] = TensorInfo(name, n, n // block * type_bytes, n_dims)
    return table
