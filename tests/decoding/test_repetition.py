"""Repetition controls (``repetition_penalty``, ``no_repeat_ngram_size``): transformers' math on hand-written and
random logits, applied at every verified position from its own prefix, so every mode equals plain masked decoding."""

from __future__ import annotations

import pytest
import torch
from pydantic import BaseModel
from transformers.generation.logits_process import NoRepeatNGramLogitsProcessor, RepetitionPenaltyLogitsProcessor

import structspec
from structspec import OptionError, Regex, SelfDraft, TreeDrafter
from structspec.decoding.repetition import Repetition, ngram_bans, path_tails, penalize, repetition_logits
from structspec.testing import tiny_lm
from structspec.tools.tasks import extraction_prompt

LIST = {"type": "array", "items": {"enum": ["Oslo", "Lima", "Paris", "Rome"]}, "minItems": 6, "maxItems": 8}
WORDS = {"type": "object", "properties": {"skills": {"type": "array", "items": {"type": "string", "maxLength": 6},
                                                     "maxItems": 5}}, "required": ["skills"]}
SPECS = [LIST, WORDS, Regex(r"(ab|ba|a|b|c){4,12}")]
PROMPT = "Skills: Oslo Lima Paris, ab ba abc. As JSON:"
CONTROLS = [pytest.param(dict(repetition_penalty=1.5, no_repeat_ngram_size=3), id="both"),
            pytest.param(dict(repetition_penalty=3.0), id="penalty", marks=pytest.mark.slow),
            pytest.param(dict(no_repeat_ngram_size=2), id="ngram", marks=pytest.mark.slow)]


def test_the_penalty_divides_positive_and_multiplies_negative_seen_logits() -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, float("-inf")]])
    seen = torch.tensor([[True, True, False, True]])
    assert penalize(logits, seen, 2.0).tolist() == [[1.0, -2.0, 0.5, float("-inf")]]


def test_ngram_bans_are_the_tokens_that_followed_the_last_tokens() -> None:
    prefix = torch.tensor([5, 6, 7, 8, 6, 9, 5, 6])
    assert ngram_bans(prefix, 3).tolist() == [7]  # "5 6" was followed by 7
    assert sorted(ngram_bans(prefix, 2).tolist()) == [7, 9]  # "6" was followed by 7 and by 9
    assert sorted(set(ngram_bans(prefix, 1).tolist())) == [5, 6, 7, 8, 9]  # every token seen
    assert ngram_bans(prefix[:1], 3).tolist() == []  # too short to hold an (n−1)-gram


def test_path_tails_are_the_tokens_from_the_root() -> None:
    # a tree: 10 and 11 after the root, 12 after 10, 13 after 12
    assert path_tails([10, 11, 12, 13], [-1, -1, 0, 2]) == [[], [10], [11], [10, 12], [10, 12, 13]]
    assert path_tails([4, 5], [-1, 0]) == [[], [4], [4, 5]]  # a chain


@pytest.mark.parametrize("seed", range(20))
def test_the_controls_equal_transformers_processors_on_random_logits(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    vocab, rows = 40, 5
    prompt = torch.randint(0, 12, (int(torch.randint(1, 30, (), generator=g)),), generator=g).tolist()
    tails = [torch.randint(0, 12, (i,), generator=g).tolist() for i in range(rows)]
    logits = torch.randn(rows, vocab, generator=g) * 3
    penalty, n = float(torch.rand((), generator=g)) * 2 + 0.5, int(torch.randint(1, 5, (), generator=g))
    ours = repetition_logits(logits, prompt, tails, Repetition(penalty, n))
    for r, tail in enumerate(tails):
        ids = torch.tensor([prompt + tail])
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits[r : r + 1].clone())
        theirs = NoRepeatNGramLogitsProcessor(n)(ids, theirs)
        if theirs.isfinite().any():  # (else ours keeps the row unbanned: tested below)
            torch.testing.assert_close(ours[r : r + 1], theirs, rtol=0, atol=0)


def test_a_ban_that_would_leave_no_allowed_token_is_lifted() -> None:
    logits = torch.tensor([[float("-inf"), 0.0, float("-inf")], [1.0, 2.0, 3.0]])
    out = repetition_logits(logits, [1, 1], [[], []], Repetition(no_repeat_ngram_size=2))
    assert out[0].tolist() == logits[0].tolist()  # "1" was followed by 1: banned, but it is all the FSM allows
    assert out[1].tolist() == [1.0, float("-inf"), 3.0]  # the same ban, where other tokens are allowed


def test_no_control_leaves_the_logits_as_they_are() -> None:
    logits = torch.randn(3, 7)
    assert repetition_logits(logits, [1, 2], [[], [3], [3, 4]], Repetition()) is logits


def _plain_with_transformers_processors(lm: structspec.LM, spec, prompt: str, penalty: float, budget: int) -> list[int]:
    """Greedy masked decoding written out with transformers' own processor: the full sequence fed every step,
    the prompt in ``input_ids``, masked by the FSM, then the processor, then argmax."""
    fsm = structspec.compile(spec, lm).fsm
    ids, out, state = lm.encode_prompt(prompt), [], fsm.initial_state
    processor = RepetitionPenaltyLogitsProcessor(penalty)
    while len(out) < budget and not fsm.is_complete(state):
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids + out])).logits[:, -1].float()
        masked = torch.full_like(logits, float("-inf"))
        allowed = torch.tensor(fsm.allowed_token_ids(state).tolist(), dtype=torch.long)
        masked[0, allowed] = logits[0, allowed]
        token = int(processor(torch.tensor([ids + out]), masked).argmax())
        if token in fsm.eos_token_ids:
            break
        out.append(token)
        state = fsm.next_state(state, token)
    return out


@pytest.mark.parametrize("spec", SPECS[:2], ids=["list", "words"])
def test_plain_masked_decoding_with_a_penalty_is_transformers_with_its_processor(spec, byte_lm) -> None:
    expected = _plain_with_transformers_processors(byte_lm, spec, PROMPT, 3.0, 40)
    ours = structspec.generate_result(byte_lm, spec, PROMPT, max_new_tokens=40, fast_forward="off", draft=None,
                                      repetition_penalty=3.0)
    assert ours.token_ids == expected
    plain = structspec.generate_result(byte_lm, spec, PROMPT, max_new_tokens=40, fast_forward="off", draft=None)
    assert plain.token_ids != expected  # the penalty changed the output: the comparison above could fail


@pytest.fixture(scope="module")
def other_byte_lm() -> structspec.LM:
    return tiny_lm("byte_level", seed=7)


def _modes(lm: structspec.LM, other: structspec.LM) -> dict[str, dict]:
    return {"default": {}, "fast-forward": dict(draft=None), "lookahead": dict(draft="lookahead"),
            "tree": dict(draft=TreeDrafter()), "self-draft": dict(draft=SelfDraft()),
            "draft model": dict(draft=other)}


@pytest.mark.parametrize("controls", CONTROLS)
def test_every_mode_equals_plain_masked_decoding_with_the_controls_on(controls, byte_lm, other_byte_lm) -> None:
    changed = 0
    for spec in SPECS:
        plain = structspec.generate_result(byte_lm, spec, PROMPT, max_new_tokens=48, fast_forward="off", draft=None,
                                           **controls).token_ids
        unpenalized = structspec.generate_result(byte_lm, spec, PROMPT, max_new_tokens=48, fast_forward="off",
                                                 draft=None).token_ids
        changed += plain != unpenalized
        for name, mode in _modes(byte_lm, other_byte_lm).items():
            ids = structspec.generate_result(byte_lm, spec, PROMPT, max_new_tokens=48, **mode, **controls).token_ids
            assert ids == plain, f"{name} on {spec}"
        events = list(structspec.stream(byte_lm, spec, PROMPT, max_new_tokens=48, **controls))
        assert events[-1].result.token_ids == plain, f"stream on {spec}"
    assert changed  # the controls changed some output: the comparisons could fail


@pytest.mark.parametrize("draft", ["prompt_lookup", "lookahead", None])
def test_a_batch_row_equals_the_row_alone_with_the_controls_on(draft, byte_lm) -> None:
    prompts = [PROMPT, "Cities: Rome Rome Rome. JSON:", "ab ab ab ba", "Lima"]
    controls = dict(repetition_penalty=2.0, no_repeat_ngram_size=2)
    alone = [structspec.generate_result(byte_lm, LIST, p, max_new_tokens=40, fast_forward="off", draft=None,
                                        **controls).token_ids for p in prompts]
    batch = structspec.generate_batch(byte_lm, LIST, prompts, batch_size=3, max_new_tokens=40, draft=draft,
                                      **controls)
    assert [r.token_ids for r in batch] == alone


def test_a_sampled_row_is_the_same_sample_in_every_fast_forward_mode(byte_lm) -> None:
    """Point-mass drafts (prompt lookup, forced text) draw y ~ p as plain sampling does, from penalized p."""
    controls = dict(repetition_penalty=1.8, no_repeat_ngram_size=3, temperature=1.3)
    changed = 0
    for seed in range(1, 6):
        plain = structspec.generate_result(byte_lm, WORDS, PROMPT, max_new_tokens=40, fast_forward="off", draft=None,
                                           seed=seed, **controls).token_ids
        fast = structspec.generate_result(byte_lm, WORDS, PROMPT, max_new_tokens=40, seed=seed, **controls).token_ids
        assert fast == plain
        changed += plain != structspec.generate_result(byte_lm, WORDS, PROMPT, max_new_tokens=40, fast_forward="off",
                                                       draft=None, seed=seed, temperature=1.3).token_ids
    assert changed


@pytest.mark.parametrize("keyword, value", [("repetition_penalty", 0), ("repetition_penalty", -1.0),
                                            ("repetition_penalty", True), ("no_repeat_ngram_size", -1),
                                            ("no_repeat_ngram_size", 2.5)])
def test_a_bad_control_is_an_option_error_naming_it(keyword: str, value, byte_lm) -> None:
    with pytest.raises(OptionError, match=keyword):
        structspec.generate_result(byte_lm, LIST, PROMPT, **{keyword: value})


class JobAd(BaseModel):
    title: str
    required_skills: list[str]


LOOPING_AD = ("Job ad: Junior Developer. Required skills: Python, Python scripting, Python testing, Python packaging, "
              "Python web frameworks, Python data tools.")


def test_smollm2_stops_looping_in_a_string_array_with_a_repetition_penalty(smollm2: structspec.LM) -> None:
    prompt = extraction_prompt(LOOPING_AD, JobAd)
    looping = structspec.generate_result(smollm2, JobAd, prompt, max_new_tokens=60)
    assert looping.stop_reason == "max_new_tokens"  # greedy writes "Python web development" over and over
    runs = [structspec.generate_result(smollm2, JobAd, prompt, max_new_tokens=60, repetition_penalty=1.2, **mode)
            for mode in (dict(draft=None, fast_forward="off"), {}, dict(draft="lookahead"))]
    assert runs[0].stop_reason == "fsm_complete"
    assert JobAd.model_validate_json(runs[0].text)
    assert runs[1].token_ids == runs[0].token_ids and runs[2].token_ids == runs[0].token_ids


def test_extract_takes_the_controls_and_refuses_a_bad_one_before_the_model_loads(
        tmp_path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from structspec.tools.cli import main
    from structspec.tools.command import EXIT_CONFIG

    def load(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded before the error was found")

    monkeypatch.setattr(structspec, "load", load)
    (tmp_path / "in.jsonl").write_text('{"id": "a", "text": "hi"}\n')
    (tmp_path / "schema.json").write_text('{"type": "array", "items": {"type": "string"}}')
    argv = ["extract", "--schema", str(tmp_path / "schema.json"), "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl")]
    for bad, named in ((["--repetition-penalty", "0"], "repetition_penalty must be > 0"),
                       (["--no-repeat-ngram-size", "-2"], "no_repeat_ngram_size must be ≥ 0")):
        assert main(argv + bad) == EXIT_CONFIG
        assert named in capsys.readouterr().err
