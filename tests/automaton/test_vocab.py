"""`structspec.vocab`: token bytes, special tokens and fingerprints, checked against the tokenizers.

The key property: concatenating ``token_bytes`` of the ids a tokenizer encodes a
string to gives back that string's UTF-8 bytes. The SentencePiece-style
tokenizer (Llama 2 layout) prepends ``▁`` to the text before tokenizing and its
decoder strips one leading space again; ``token_bytes`` hold what a token adds
in continuation, so for it the concatenation is ``b" " + s.encode()``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken

from structspec import LM
from structspec.testing import byte_level_tokenizer, sentencepiece_tokenizer
from structspec.vocab import TokenVocab, vocab_from_tokenizer

STRINGS = [
    "a", "hello", "Hello, world!", " leading space", "trailing space ", "  two  spaces  ",
    "\t", "line\nbreak", "\n\n", "\r\n", "tab\tand space", "{}", "[]", '""',
    '{"name":"Alice","age":31}', '{"name": "Bob", "age": 45, "tags": ["a", "b"]}',
    '{"a":{"b":[1,2,{"c":null}]}}', '"escaped \\" quote"', "back\\slash",
    '{"price":12.50,"active":true}', "-0.5e+10", "1234567890", "null", "true false",
    "red green blue", "Alice is 31 years old.", "She said: \"I'll go.\"", "x" * 40,
    "é", "héllo {\"a\": 1} ✓", "café naïve résumé", "Zürich ß", "日本", "日本語のテキスト", "中文",
    "한국어", "Ελληνικά", "русский", "עברית", "العربية", "😀", "👍🏽", "👨‍👩‍👧", "🇫🇷",
    "e\u0301", "\u00a0nbsp", "zero\u200bwidth", "\x00", "\x7f", "\x1b[0m", "\uffff", "\U0010ffff",
    'mixed: {"k":"日本","e":"😀"}',
]
# "▁" itself is not in the list: a SentencePiece normalizer turns spaces into "▁",
# so a literal "▁" in the input reads back as a space (lossy by design).


def _joined(vocab: TokenVocab, ids: list[int]) -> bytes:
    return b"".join(vocab.token_bytes[i] for i in ids)  # a special token's None raises TypeError


def _expected(kind: str, s: str) -> bytes:
    """The bytes of ``s`` as encoded: the SentencePiece layout's prepended "▁" is a space."""
    return (b" " if kind == "sentencepiece" else b"") + s.encode()


@pytest.fixture(params=["byte_level", "sentencepiece"])
def kind(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def lm(kind: str, byte_lm: LM, sp_lm: LM) -> LM:
    return byte_lm if kind == "byte_level" else sp_lm


@pytest.mark.parametrize("s", STRINGS)
def test_token_bytes_spell_the_encoded_text(lm: LM, kind: str, s: str) -> None:
    ids = lm.tokenizer.encode(s, add_special_tokens=False)
    assert _joined(lm.vocab, ids) == _expected(kind, s)


_TEXT = st.text(
    st.one_of(st.sampled_from(list(' {}[]":,.\\-+0123456789abcxyz\n\t')), st.characters(codec="utf-8")),
    min_size=1, max_size=30,
)


@pytest.mark.slow
@given(_TEXT)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_token_bytes_spell_any_text(lm: LM, kind: str, s: str) -> None:
    assume("▁" not in s and not any(t in s for t in lm.tokenizer.all_special_tokens))
    ids = lm.tokenizer.encode(s, add_special_tokens=False)
    assert _joined(lm.vocab, ids) == _expected(kind, s)


def _decoder_disagreements(lm: LM) -> tuple[int, list[tuple[int, str]]]:
    """Decode every non-special token after "a"; return how many and those not decoded as "a" + their bytes.

    The prefix keeps a SentencePiece decoder's Strip off the token under test. A
    token that holds part of a character decodes to U+FFFD, as Python's "replace"
    error handler decodes its bytes.
    """
    tok, vocab = lm.tokenizer, lm.vocab
    a = tok.convert_tokens_to_ids("a")
    ids = [i for i, b in enumerate(vocab.token_bytes) if b is not None]
    texts = tok.batch_decode([[a, i] for i in ids], clean_up_tokenization_spaces=False)
    wrong = [
        (i, tok.convert_ids_to_tokens(i)) for i, text in zip(ids, texts)
        if text != (b"a" + vocab.token_bytes[i]).decode("utf-8", "replace")
    ]
    return len(ids), wrong


def test_token_bytes_agree_with_the_tokenizer_decoder(lm: LM) -> None:
    checked, wrong = _decoder_disagreements(lm)
    assert wrong == []
    assert checked == len(lm.vocab) - len(lm.tokenizer.all_special_ids)


def test_every_byte_is_one_token(lm: LM) -> None:
    singles = {b for b in lm.vocab.token_bytes if b is not None and len(b) == 1}
    assert singles == {bytes([i]) for i in range(256)}


def test_byte_fallback_tokens_are_single_raw_bytes(sp_lm: LM) -> None:
    tok, vocab = sp_lm.tokenizer, sp_lm.vocab
    for b in (0x00, 0x0A, 0x41, 0x80, 0xE2, 0xFF):
        assert vocab.token_bytes[tok.convert_tokens_to_ids(f"<0x{b:02X}>")] == bytes([b])
    assert vocab.token_bytes[tok.convert_tokens_to_ids("▁")] == b" "


def test_multi_character_tokens(byte_lm: LM, sp_lm: LM) -> None:
    byte_tokens = set(byte_lm.vocab.token_bytes)
    assert {b'{"', b'":"', b'","', b"name", b" the"} <= byte_tokens
    assert {b'":"', b'","', b" true"} <= set(sp_lm.vocab.token_bytes)


def test_special_tokens_have_no_bytes(lm: LM) -> None:
    tok, vocab = lm.tokenizer, lm.vocab
    assert len(vocab) == len(tok)
    assert {i for i, b in enumerate(vocab.token_bytes) if b is None} == set(tok.all_special_ids)
    assert {tok.eos_token_id, tok.bos_token_id} <= set(tok.all_special_ids)


def test_eos_id(byte_lm: LM, sp_lm: LM) -> None:
    assert byte_lm.vocab.eos_token_id == byte_lm.tokenizer.convert_tokens_to_ids("<eos>") == 0
    assert sp_lm.vocab.eos_token_id == sp_lm.tokenizer.convert_tokens_to_ids("</s>") == 2


def test_outlines_map_excludes_eos_and_special_tokens(lm: LM) -> None:
    vocab, special = lm.vocab, set(lm.tokenizer.all_special_ids)
    mapping = vocab.outlines_map()
    ids = [i for group in mapping.values() for i in group]
    assert len(ids) == len(set(ids))
    assert set(ids) == set(range(len(vocab))) - special
    assert vocab.eos_token_id not in ids
    assert all(vocab.token_bytes[i] == b for b, group in mapping.items() for i in group)


def test_decode_omits_special_tokens(byte_lm: LM) -> None:
    tok, vocab = byte_lm.tokenizer, byte_lm.vocab
    ids = tok.encode('{"name":"日本"}', add_special_tokens=False)
    assert vocab.decode([tok.bos_token_id, *ids, tok.eos_token_id]) == '{"name":"日本"}'


def test_decode_replaces_a_cut_character(byte_lm: LM) -> None:
    tok, vocab = byte_lm.tokenizer, byte_lm.vocab
    ids = tok.encode("😀", add_special_tokens=False)
    assert len(ids) > 1
    assert vocab.decode(ids[:-1]) == "\ufffd"


MAKERS = [(byte_level_tokenizer, "byte_level"), (sentencepiece_tokenizer, "sentencepiece")]


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_added_tokens(make: Callable[[], Any], kind: str) -> None:
    """A non-special added token is spelled by its text; a special one has no bytes."""
    tok = make()
    tok.add_tokens([AddedToken("<tool>", normalized=False, special=False)])
    tok.add_special_tokens({"additional_special_tokens": ["<|im_end|>"]})
    vocab = vocab_from_tokenizer(tok)
    tool, end = tok.convert_tokens_to_ids(["<tool>", "<|im_end|>"])
    assert vocab.token_bytes[tool] == b"<tool>"
    assert vocab.token_bytes[end] is None
    ids = tok.encode("call <tool> now<|im_end|>", add_special_tokens=False)
    assert tool in ids and end in ids
    # The Llama 2 layout prepends "▁" to the text after an added token too, so it
    # decodes as "call <tool>  now": the bytes follow the tokenizer, lossy or not.
    lead = " " if kind == "sentencepiece" else ""
    assert vocab.decode(ids) == lead + tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize(("make", "kind", "token", "s"), [
    # A vocabulary entry also listed as a non-special added token (converted
    # SentencePiece models list user-defined pieces so): it still decodes as " is".
    (byte_level_tokenizer, "byte_level", AddedToken("Ġis", normalized=False, special=False), "Alice is 31"),
    (sentencepiece_tokenizer, "sentencepiece", AddedToken("▁is", normalized=False, special=False),
     "Alice is 31"),
    # tok.add_tokens(["<tool>"]) on a Llama 2 layout: the normalizer prepends "▁" to the
    # added token's content, so the token is "▁<tool>" (" <tool>") to the tokenizer.
    (sentencepiece_tokenizer, "sentencepiece", "<tool>", "call <tool> now"),
])
def test_added_token_spelled_like_the_tokenizer(
    make: Callable[[], Any], kind: str, token: AddedToken | str, s: str
) -> None:
    tok = make()
    tok.add_tokens([token])
    vocab = vocab_from_tokenizer(tok)
    ids = tok.encode(s, add_special_tokens=False)
    assert tok.decode(ids) == s
    assert _joined(vocab, ids) == _expected(kind, s)


def test_no_eos_is_an_error() -> None:
    tok = byte_level_tokenizer()
    tok.eos_token = None
    with pytest.raises(ValueError, match="eos_token"):
        vocab_from_tokenizer(tok)


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_fingerprint_is_stable_across_builds(make: Callable[[], Any], kind: str) -> None:
    a, b = vocab_from_tokenizer(make()), vocab_from_tokenizer(make())
    assert a is not b and a.fingerprint == b.fingerprint


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_fingerprint_changes_with_the_vocabulary(make: Callable[[], Any], kind: str) -> None:
    base = vocab_from_tokenizer(make()).fingerprint
    plain, special, other_eos = make(), make(), make()
    plain.add_tokens(["<extra>"])
    special.add_special_tokens({"additional_special_tokens": ["<extra>"]})
    other_eos.eos_token = other_eos.bos_token
    prints = [base] + [vocab_from_tokenizer(t).fingerprint for t in (plain, special, other_eos)]
    assert len(set(prints)) == 4


@pytest.mark.parametrize(("make", "kind"), MAKERS)
def test_a_tokenizer_is_read_once_and_again_after_it_changes(make: Callable[[], Any], kind: str) -> None:
    tok = make()
    first = vocab_from_tokenizer(tok)
    assert vocab_from_tokenizer(tok) is first  # kept: a serving engine compiles every request with it
    assert vocab_from_tokenizer(make()) is not first  # another object is read on its own
    changed = []
    for change in (lambda: tok.add_tokens(["<extra>"]),
                   lambda: tok.add_special_tokens({"additional_special_tokens": ["<other>"]}),
                   lambda: setattr(tok, "eos_token", tok.bos_token)):
        change()
        changed.append(vocab_from_tokenizer(tok))
        assert changed[-1].fingerprint != (changed[-2] if len(changed) > 1 else first).fingerprint
    assert changed[-1] == vocab_from_tokenizer(make_changed(make))


def make_changed(make: Callable[[], Any]) -> Any:
    """A fresh tokenizer changed as the test above changes its own."""
    tok = make()
    tok.add_tokens(["<extra>"])
    tok.add_special_tokens({"additional_special_tokens": ["<other>"]})
    tok.eos_token = tok.bos_token
    return tok


def test_fingerprint_differs_between_tokenizers(byte_lm: LM, sp_lm: LM) -> None:
    assert byte_lm.vocab.fingerprint != sp_lm.vocab.fingerprint


def _normalized(tok: Any, s: str) -> bytes:
    """``s`` as the tokenizer's normalizer leaves it (Qwen: NFC; Gemma: "▁" for spaces, read back as spaces)."""
    normalizer = tok.backend_tokenizer.normalizer
    return (normalizer.normalize_str(s) if normalizer else s).replace("▁", " ").encode()


@pytest.mark.real_model
@pytest.mark.parametrize("s", STRINGS)
def test_real_token_bytes_spell_the_encoded_text(real_lm: LM, s: str) -> None:
    ids = real_lm.tokenizer.encode(s, add_special_tokens=False)
    assert _joined(real_lm.vocab, ids) == _normalized(real_lm.tokenizer, s)


@pytest.mark.real_model
def test_real_token_bytes_agree_with_the_tokenizer_decoder(real_lm: LM) -> None:
    """Every token id of each shipped tokenizer, in context, decodes to exactly its bytes."""
    checked, wrong = _decoder_disagreements(real_lm)
    assert wrong == []
    special = {i for i, t in real_lm.tokenizer.added_tokens_decoder.items() if t.special}
    assert checked == len(real_lm.vocab) - len(special)


@pytest.mark.real_model
def test_real_special_tokens_have_no_bytes(real_lm: LM) -> None:
    tok, vocab = real_lm.tokenizer, real_lm.vocab
    special = {i for i, t in tok.added_tokens_decoder.items() if t.special}
    assert {i for i, b in enumerate(vocab.token_bytes) if b is None} == special
    assert set(tok.all_special_ids) <= special


@pytest.mark.real_model
def test_smollm2_specials(smollm2: LM) -> None:
    tok, vocab = smollm2.tokenizer, smollm2.vocab
    assert vocab.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert {i for i, b in enumerate(vocab.token_bytes) if b is None} == set(tok.added_tokens_decoder)
    # SmolLM2 lacks a few one-byte tokens (some control bytes, bytes UTF-8 never uses),
    # but has every printable ASCII byte and every byte of a BMP character.
    singles = {b[0] for b in vocab.token_bytes if b is not None and len(b) == 1}
    assert set(range(0x20, 0x7F)) | set(range(0x80, 0xC0)) | set(range(0xC2, 0xF0)) <= singles
