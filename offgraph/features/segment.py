"""Text segmenters of the ``tokenize`` op: text -> terms. Training and serving share them.

- ``whitespace`` (the default, the op's behaviour before segmenters existed): split on any
  whitespace, or on the field's ``separator``.
- ``cjk``: every CJK character (Han ideographs, kana) is a term; runs of other letters and
  digits stay words; anything else (spaces, punctuation) separates. "跑鞋 nike air" ->
  [跑, 鞋, nike, air]. Hangul is left in words: Korean writes spaces between words. No
  dictionary, no version to drift: its rule is part of the FG version.
- ``jieba``: jieba's dictionary segmentation (``cut`` with HMM off, so only dictionary words
  and single characters come out: no guessed words), whitespace and punctuation-only pieces
  dropped. Its output depends on jieba's version and bundled dictionary, so the version a
  model was trained with is recorded (``segmenter_record``) in the run and the manifest, and a
  scorer with another version refuses the model (``check_segmenters``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable

SEGMENTERS = ("whitespace", "cjk", "jieba")

# Han (CJK Unified Ideographs + extension A, compatibility ideographs, extensions B-F via the
# astral range), Hiragana, Katakana; CJK symbols/punctuation (U+3000-303F) are separators.
_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff\U00020000-\U0002fa1f"
_CJK_TERMS = re.compile(f"[{_CJK}]|[^\\W_{_CJK}]+")
_HAS_WORD = re.compile(r"[^\W_]")


def _cjk(text: str, sep: str | None) -> list[str]:
    return _CJK_TERMS.findall(text)


_jieba_lock = threading.Lock()
_jieba_tokenizer = None


def _jieba_module():
    try:
        import jieba
    except ImportError:
        raise ValueError("segmenter 'jieba' needs the jieba package (pip install jieba)") from None
    return jieba


def _jieba_tok():
    global _jieba_tokenizer
    tok = _jieba_tokenizer
    if tok is None:
        with _jieba_lock:  # the dictionary loads once (about a second), not once per thread
            if _jieba_tokenizer is None:
                jieba = _jieba_module()
                jieba.setLogLevel(30)  # its "Building prefix dict" lines are noise in a server log
                t = jieba.Tokenizer()
                t.initialize()
                _jieba_tokenizer = t
            tok = _jieba_tokenizer
    return tok


def _jieba(text: str, sep: str | None) -> list[str]:
    return [t for t in _jieba_tok().cut(text, HMM=False) if _HAS_WORD.search(t)]


def prepare(name: str) -> None:
    """Load what a segmenter needs before the first text (jieba's dictionary: about a second), so that a
    server pays it while loading the model, not on a request."""
    segment_fn(name)
    if name == "jieba":
        _jieba_tok()


def _whitespace(text: str, sep: str | None) -> list[str]:
    return [x for x in text.split(sep) if x]


_IMPL: dict[str, Callable[[str, str | None], list[str]]] = {"whitespace": _whitespace, "cjk": _cjk, "jieba": _jieba}


def segment_fn(name: str) -> Callable[[str, str | None], list[str]]:
    """``fn(text, separator) -> terms`` of a segmenter (the separator matters to whitespace only)."""
    try:
        return _IMPL[name]
    except KeyError:
        raise ValueError(f"unknown segmenter {name!r}: expected one of {list(SEGMENTERS)}") from None


def segmenter_record(name: str) -> dict:
    """What a model records of a segmenter: its name, and for a library its version (what decides its
    output). ValueError when the library is missing."""
    if name == "jieba":
        return {"name": "jieba", "library": "jieba", "version": str(_jieba_module().__version__), "hmm": False}
    segment_fn(name)
    return {"name": name}


def segmenters_of(spec) -> dict[str, dict]:
    """``{field: segmenter_record}`` for every tokenize field of a spec (the running library's versions)."""
    return {
        f.name: segmenter_record(f.params.get("segmenter", "whitespace")) for f in spec.fields if f.op == "tokenize"
    }


def check_segmenters(spec, recorded: dict | None, where: str) -> None:
    """Refuse (ValueError naming the field and both versions) a model whose tokenize fields were segmented
    by another segmenter or library version than this process has. ``recorded`` None (manifests and runs
    written before segmenters existed) means whitespace for every field."""
    for f in spec.fields:
        if f.op != "tokenize":
            continue
        name = f.params.get("segmenter", "whitespace")
        want = (recorded or {}).get(f.name, {"name": "whitespace"})
        try:
            have = segmenter_record(name)
        except ValueError as e:
            raise ValueError(f"{where}: field '{f.name}': {e}; the model was trained with {want}") from None
        if want != have:
            raise ValueError(
                f"{where}: field '{f.name}' was segmented by {want} at training, this process has "
                f"{have}: its terms (and so its rows) could differ; install the recorded version "
                "or retrain"
            )
