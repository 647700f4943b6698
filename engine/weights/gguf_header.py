"""The tensor table of a GGUF file and its weight format, read from its header alone: no gguf
package, no torch, no tensor data.

`localchat models` needs only each tensor's shape; gguf.GGUFReader builds numpy views of every
metadata field first (the vocabulary alone is ~100k of them), which took seconds a file.
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = b"GGUF"
# Fixed sizes of the scalar value types, by GGUF type id; 8 is a string, 9 an array.
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9
_UINT32, _INT32 = 4, 5
FILE_TYPE_KEY = "general.file_type"
# GGML tensor type ids -> names (gguf.GGMLQuantizationType), for the types worth naming.
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K", 11: "Q3_K",
              12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
              20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 29: "IQ1_M", 30: "BF16"}
# llama.cpp's file types (general.file_type, gguf.LlamaFileType): the names its quantize tool
# gives a mix such as Q4_K_M (Q4_K with some Q6_K tensors).
FILE_TYPES = {0: "fp32", 1: "fp16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
              12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
              21: "Q2_K_S", 32: "bf16"}
_FLOAT_NAMES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}


def weights_label(file_type: int | None, matrices: dict[str, int]) -> str:
    """The weight format of a GGUF file as localchat reports it: the file type llama.cpp wrote
    ("Q4_K_M"), else the type holding most elements of the matrices (type name -> elements)."""
    if file_type in FILE_TYPES:
        return FILE_TYPES[file_type]
    if not matrices:
        return "unknown"
    kind = max(matrices, key=matrices.get)
    return _FLOAT_NAMES.get(kind, kind)


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGUF order: fastest-varying dimension first
    type_id: int  # GGML quantization type

    @property
    def n_elements(self) -> int:
        return math.prod(self.shape)


class _Cursor:
    """Reads little- or big-endian values from a buffer, failing with ValueError past its end."""

    def __init__(self, buf, endian: str) -> None:
        self.buf, self.pos, self.endian = buf, 0, endian

    def unpack(self, fmt: str):
        s = struct.Struct(self.endian + fmt)
        if self.pos + s.size > len(self.buf):
            raise ValueError("the header runs past the end of the file")
        values = s.unpack_from(self.buf, self.pos)
        self.pos += s.size
        return values

    def u32(self) -> int:
        return self.unpack("I")[0]

    def u64(self) -> int:
        return self.unpack("Q")[0]

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise ValueError("the header runs past the end of the file")
        self.pos += n

    def string(self) -> str:
        n = self.u64()
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start:self.pos]).decode("utf-8", "replace")

    def skip_value(self, type_id: int) -> None:
        if type_id in _SCALAR_BYTES:
            self.skip(_SCALAR_BYTES[type_id])
        elif type_id == _STRING:
            self.skip(self.u64())
        elif type_id == _ARRAY:
            item, count = self.u32(), self.u64()
            if item in _SCALAR_BYTES:
                self.skip(_SCALAR_BYTES[item] * count)
            elif item == _STRING:  # a vocabulary: ~100k strings, so the loop is kept tight
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.skip_value(item)
        else:
            raise ValueError(f"unknown metadata value type {type_id}")


    def _skip_strings(self, count: int) -> None:
        length = struct.Struct(self.endian + "Q").unpack_from
        buf, pos, end = self.buf, self.pos, len(self.buf)
        for _ in range(count):
            if pos + 8 > end:
                raise ValueError("the header runs past the end of the file")
            pos += 8 + length(buf, pos)[0]
        if pos > end:
            raise ValueError("the header runs past the end of the file")
        self.pos = pos


def read_tensor_infos(path: Path) -> list[TensorInfo]:
    """Every tensor's name, shape and type, in file order. ValueError when `path` is not a GGUF
    (version 2 or 3) or its header is cut short; OSError when it cannot be read."""
    return read_header(path)[0]


def header_weights_label(path: Path) -> str:
    """weights_label from the header alone (`localchat doctor`); errors as read_tensor_infos."""
    infos, file_type = read_header(path)
    matrices: dict[str, int] = {}
    for t in infos:
        if len(t.shape) == 2:
            name = TYPE_NAMES.get(t.type_id, f"type {t.type_id}")
            matrices[name] = matrices.get(name, 0) + t.n_elements
    return weights_label(file_type, matrices)


def read_header(path: Path) -> tuple[list[TensorInfo], int | None]:
    """read_tensor_infos, and the file type (general.file_type) when the metadata has one."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != MAGIC:
            raise ValueError(f"{Path(path).name} is not a GGUF file")
        endian = "<" if struct.unpack_from("<I", buf, 4)[0] in (2, 3) else ">"
        cur = _Cursor(buf, endian)
        cur.skip(4)
        if cur.u32() not in (2, 3):
            raise ValueError(f"{Path(path).name}: unsupported GGUF version")
        n_tensors, n_fields = cur.u64(), cur.u64()
        file_type = None
        for _ in range(n_fields):
            key, value_type = cur.string(), cur.u32()
            if key == FILE_TYPE_KEY and value_type in (_UINT32, _INT32):
                file_type = cur.unpack("I" if value_type == _UINT32 else "i")[0]
            else:
                cur.skip_value(value_type)
        tensors = []
        for _ in range(n_tensors):
            name = cur.string()
            n_dims = cur.u32()
            if n_dims > 8:  # ggml tensors have at most 4
                raise ValueError(f"{Path(path).name}: tensor {name!r} claims {n_dims} dimensions")
            shape = cur.unpack(f"{n_dims}Q")
            type_id = cur.u32()
            cur.skip(8)  # data offset
            tensors.append(TensorInfo(name, tuple(shape), type_id))
        return tensors, file_type
