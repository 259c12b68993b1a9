"""Word segmentation of Chinese and Japanese, which write no spaces between words.

The ``unicode`` tokenizer's regex keeps a run of CJK characters whole, so without this a Japanese
or Chinese stream would learn clauses (``分散型のオペレーティングシステムは``), each seen once, instead of
words. Two dictionary segmenters from PyPI do it (``bench/record_formats.py`` measures them):

- Chinese: ``rjieba`` (jieba in Rust, its dictionary built in): about 30 MB/s on one core, 4.6 MB installed.
- Japanese: SudachiPy with ``sudachidict-core``, split mode C (the longest units: ``オペレーティングシステム``
  and ``東京都`` stay one word, which suits a vocabulary of embeddings): about 2 MB/s on one core,
  200 MB installed.

jieba on Japanese cuts katakana into single characters, and Sudachi on Chinese into characters: each
language needs its own. Design: docs/design/0007-tokenizers.md

Routing (``LIVEVEC_LANGUAGE``): ``auto`` segments a record's runs as Japanese when the record holds
kana anywhere (Chinese is written without them, and Japanese rarely goes a sentence without them),
else as Chinese; ``ja`` or ``zh`` forces one, for streams of one language (a Japanese headline all in
kanji would otherwise go to the Chinese segmenter).

The segmenters load on first use (Sudachi's dictionary takes about 50 ms), one per thread: the
tokenizer runs in several worker threads at once.
"""
from __future__ import annotations

import re
import threading

from ps_bridge.settings import SettingError

LANGUAGES = ("auto", "zh", "ja")

# Han (with extensions and compatibility ideographs), kana; after NFKC, so half-width kana are full-width.
CJK_RE = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
KANA_RE = re.compile(r"[\u3040-\u30ff\u31f0-\u31ff]")

# Sudachi refuses inputs over 49,149 bytes; a run without punctuation that long is cut first.
_SUDACHI_CHARS = 4096

_local = threading.local()


def _japanese():
    tokenizer = getattr(_local, "sudachi", None)
    if tokenizer is None:
        from sudachipy import Dictionary, SplitMode
        tokenizer = _local.sudachi = Dictionary(dict="core").tokenizer(mode=SplitMode.C)
    return tokenizer


def segment_japanese(run: str) -> list[str]:
    tokenizer = _japanese()
    out: list[str] = []
    for i in range(0, len(run), _SUDACHI_CHARS):
        out.extend(m.surface() for m in tokenizer.tokenize(run[i:i + _SUDACHI_CHARS]))
    return [w for w in out if not w.isspace()]


def segment_chinese(run: str) -> list[str]:
    import rjieba
    return rjieba.cut(run)


def check_available() -> None:
    """Stops a process at start, naming the setting, rather than at the first CJK record hours into a stream."""
    try:
        import rjieba  # noqa: F401
        import sudachidict_core  # noqa: F401
        import sudachipy  # noqa: F401
    except ImportError as exc:
        raise SettingError("LIVEVEC_TOKENIZER", f"unicode needs the word segmenters rjieba, sudachipy and "
                                                f"sudachidict-core (livevec's dependencies): {exc}") from None


def segmenter_for(text: str, language: str):
    """The segmenter of a record's CJK runs (see the module docstring)."""
    if language == "ja" or (language == "auto" and KANA_RE.search(text)):
        return segment_japanese
    return segment_chinese
