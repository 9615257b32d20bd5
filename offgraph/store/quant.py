"""Record formats by name: ``get_codec("fp32" | "fp16" | "int8", dim)``.

Each codec has a fixed ``record_bytes`` and fully vectorized
``encode(vectors [K, D] f32, first_order [K] f32) -> uint8 [K, record_bytes]`` and
``decode(uint8 [K, record_bytes]) -> (vectors [K, D] f32, first_order [K] f32)``.
Layouts and error bounds are documented in ``offgraph.store._quant``.
"""

from __future__ import annotations

from collections.abc import Callable

from offgraph.store._quant import Codec, Int8RowwiseCodec, check_records, fp16_codec, fp32_codec

CODECS: dict[str, Callable[[int], Codec]] = {  # name -> codec for a given dim
    "fp32": fp32_codec,
    "fp16": fp16_codec,
    "int8": Int8RowwiseCodec,
}


def get_codec(name: str, dim: int) -> Codec:
    """The codec called ``name`` for embedding width ``dim``."""
    try:
        make = CODECS[name]
    except KeyError:
        raise ValueError(f"unknown quantization {name!r}; known: {sorted(CODECS)}") from None
    return make(dim)


def codec_names() -> list[str]:
    return sorted(CODECS)


__all__ = ["Codec", "get_codec", "codec_names", "CODECS", "check_records"]
