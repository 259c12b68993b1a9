"""The tokenizer families on real text in each script, and their compiled paths against the
Python reference: ``tokens`` keeps IDs byte for byte, ``unicode`` cuts Chinese and Japanese into
words with the dictionary segmenters, ``TokenList`` records are one sentence of their items."""
from __future__ import annotations

import random

import pytest

from online.learner.settings import LEARNER
from online.learner.tokenizers import Tokenizer, TokenList
from ps_bridge.settings import SettingError

JAPANESE = "分散型のオペレーティングシステムは、各マシンのCPUとメモリを管理する。"
CHINESE = "分布式操作系统管理每台机器的处理器和内存。北京是中华人民共和国的首都。"
IDS = "sku-123 user:42 C++ #hashtag"


def _spans(tok: Tokenizer, records) -> list[list[str]]:
    return tok.spans(records).to_sentences()


def test_tokens_keeps_ids_byte_for_byte():
    tok = Tokenizer("tokens")
    assert tok.sentences(IDS) == [["sku-123", "user:42", "C++", "#hashtag"]]
    assert _spans(tok, [IDS]) == [["sku-123", "user:42", "C++", "#hashtag"]]
    # case, punctuation, any script, emoji: split on whitespace (Unicode's too) and nothing else
    text = "Émile\u00a0l'homme,\u3000東京 مرحبا 🙂x  A.B.\tv1.2?"
    expected = [["Émile", "l'homme,", "東京", "مرحبا", "🙂x", "A.B.", "v1.2?"]]
    assert tok.sentences(text) == expected
    assert _spans(tok, [text]) == expected
    assert _spans(tok, [text.encode()]) == expected


def test_tokens_ends_sentences_at_newlines_and_records_only():
    tok = Tokenizer("tokens")
    records = ["Hello , world . Next line", "a\nb\r\n\nc d", "x"]
    expected = [["Hello", ",", "world", ".", "Next", "line"], ["a"], ["b"], ["c", "d"], ["x"]]
    assert tok.sentences_of(records) == expected
    assert _spans(tok, records) == expected
    assert tok.text_spans("\n".join(records).encode()).to_sentences() == expected


def test_tokens_never_makes_a_token_with_nul():
    # the servers' messages separate words with NUL
    tok = Tokenizer("tokens")
    assert _spans(tok, ["a\x00b c"]) == [["a", "b", "c"]] == tok.sentences("a\x00b c")


def test_compiled_tokens_agrees_with_the_python_reference_on_random_text():
    rng = random.Random(7)
    alphabet = list("ab.,:-#+ \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x00\u00a0\u2003\u3000\u3002\u0085é東🙂") + ["\u2028"]
    for _ in range(300):
        records = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 5))]
        tok = Tokenizer("tokens", max_sentence_length=rng.choice([2, 3, 10_000]), split_sentences=rng.random() < 0.7)
        expected = [s for s in tok.sentences_of(records) if s]
        assert _spans(tok, records) == expected, records
        block = "\n".join(records)
        lines = [s for s in tok.sentences_of(block.split("\n")) if s]
        assert tok.text_spans(block.encode()).to_sentences() == lines, records


def test_tokens_replaces_invalid_utf8_as_the_decoder_does():
    tok = Tokenizer("tokens")
    assert _spans(tok, [b"ab\xff cd"]) == tok.sentences(b"ab\xff cd") == [["ab\ufffd", "cd"]]
    assert tok.text_spans(b"ab\xff cd\n").to_sentences() == [["ab\ufffd", "cd"]]


def test_unicode_cuts_japanese_into_words():
    words = Tokenizer("unicode").sentences(JAPANESE)
    assert words == [["分散型", "の", "オペレーティングシステム", "は", "各", "マシン", "の", "cpu", "と", "メモリ", "を",
                      "管理", "する"]]


def test_unicode_cuts_chinese_into_words():
    words = Tokenizer("unicode").sentences(CHINESE)
    assert words == [["分布式", "操作系统", "管理", "每台", "机器", "的", "处理器", "和", "内存"],
                     ["北京", "是", "中华人民共和国", "的", "首都"]]


def test_unicode_routes_by_kana_or_by_the_language_setting():
    headline = "東京都知事選挙"          # all kanji: Chinese by default, Japanese when told
    auto = Tokenizer("unicode").sentences(headline)[0]
    japanese = Tokenizer("unicode", language="ja").sentences(headline)[0]
    assert "".join(auto) == "".join(japanese) == headline
    assert japanese == ["東京都知事選挙"] or japanese[0] == "東京都"
    # a kana anywhere in the record routes its kanji runs to the Japanese segmenter
    assert Tokenizer("unicode").sentences(headline + "です")[0][:len(japanese)] == japanese
    assert Tokenizer("unicode", language="zh").sentences(JAPANESE)[0] != Tokenizer("unicode").sentences(JAPANESE)[0]


def test_unicode_keeps_its_rules_for_english_and_ids():
    tok = Tokenizer("unicode")
    assert tok.sentences("Don't PANIC. L'homme a 3 chats!") == [["don't", "panic"], ["l'homme", "a", "3", "chats"]]
    assert tok.sentences(IDS) == [["sku", "123", "user", "42", "c", "hashtag"]]
    mixed = "Tokyo (東京) is big. 我爱北京"
    assert tok.sentences(mixed) == [["tokyo", "東京", "is", "big"], ["我", "爱", "北京"]]
    assert _spans(tok, [mixed, JAPANESE]) == tok.sentences_of([mixed, JAPANESE])


def test_text8_is_unchanged():
    assert Tokenizer("text8").sentences(IDS) == [["sku", "one", "two", "three", "user", "four", "two", "c", "hashtag"]]
    assert Tokenizer("text8").sentences(JAPANESE) == [["cpu"]]


@pytest.mark.parametrize("kind", ["text8", "unicode", "tokens"])
def test_a_token_list_is_one_sentence_of_its_items_whatever_the_tokenizer(kind):
    tok = Tokenizer(kind, max_sentence_length=3)
    items = TokenList.of(["sku-123", "Red Shoes", "", "東京", "🙂", "a\x00b"])
    expected = [["sku-123", "Red Shoes", "東京"], ["🙂", "a", "b"]]
    assert tok.sentences(items) == expected
    assert _spans(tok, [items]) == expected
    assert _spans(tok, ["plain text", items])[-2:] == expected


def test_the_tokenizer_setting_takes_tokens_and_refuses_other_names():
    assert LEARNER.read(None, {"LIVEVEC_TOKENIZER": "tokens"})["tokenizer"] == "tokens"
    with pytest.raises(SettingError, match="LIVEVEC_TOKENIZER"):
        LEARNER.read(None, {"LIVEVEC_TOKENIZER": "whitespace"})
    with pytest.raises(SettingError, match="LIVEVEC_LANGUAGE"):
        LEARNER.read(None, {"LIVEVEC_LANGUAGE": "ko"})
