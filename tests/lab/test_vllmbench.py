"""The engine benchmark's parts that run without vLLM: its options, the report's arithmetic on made-up counts,
the step counting on hand-made scheduler outputs, and how outputs are judged valid."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from lab import vllmbench as bench
from lab import vllmbench_engine as engine
from lab import vllmbench_records as records
from lab import vllmbench_report as report
from structspec.result import DraftStats, Stats
from structspec.tools.benchmarks.toolbench import Conversation
from structspec.tools.command import DEFAULT_MAX_NEW_TOKENS

WEATHER = {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]
REQUIRED = {"type": "array", "minItems": 1, "items": {
    "type": "object", "properties": {"name": {"enum": ["get_weather"]}, "parameters": WEATHER},
    "required": ["name", "parameters"]}}  # the shape vLLM's get_json_schema_from_tools gives for "required"


def conversation(choice: str, calls: int = 1) -> Conversation:
    expected = [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}] * calls
    return Conversation("c", TOOLS, [{"role": "user", "content": "weather in Oslo?"}], choice, calls > 1, expected)


# ---- options ----

def test_defaults_run_every_configuration_on_both_sets_at_batch_32() -> None:
    args = bench.arguments([])
    assert args.configs == list(bench.CONFIGS) and args.tasks == "both" and args.batch_size == 32
    assert args.max_new_tokens == DEFAULT_MAX_NEW_TOKENS and not args.prefix_job  # the CLI's and the API's
    assert bench.arguments(["--prefix-job"]).max_new_tokens == bench.JOB_MAX_NEW_TOKENS
    assert bench.arguments(["--prefix-job", "--max-new-tokens", "40"]).max_new_tokens == 40


def test_configs_keep_the_order_given() -> None:
    assert bench.arguments(["--configs", "own,xgrammar"]).configs == ["own", "xgrammar"]


@pytest.mark.parametrize("argv, message", [
    (["--configs", "xgrammar,vllm"], "unknown configuration vllm; choose among xgrammar"),
    (["--configs", "own,own"], "name each configuration once"),
    (["--records", "0"], "must be ≥ 1"),
    (["--tasks", "chat"], "invalid choice: 'chat'"),
    (["--prefix-job", "--records", "3"], "--prefix-job runs its own job: drop --records"),
])
def test_bad_options_exit_2_naming_the_option(argv: list[str], message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        bench.arguments(argv)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


# ---- the report's arithmetic ----

def test_rates_ratios_and_shares() -> None:
    t = report.Tally(records=4, seconds=10.0, output_tokens=200, steps=50)
    assert report.seconds_per_record(t) == 2.5 and report.records_per_second(t) == 0.4
    assert report.speedup(2.5, 5.0, lower_is_faster=True) == 2.0  # half the seconds: twice as fast
    assert report.speedup(0.8, 0.4, lower_is_faster=False) == 2.0
    assert report.share(50, 200) == 0.25 and report.share(None, 200) is None and report.share(3, 0) is None
    assert math.isnan(report.seconds_per_record(report.Tally()))


def test_tallies_add_up_and_an_unknown_count_stays_unknown_only_where_none_knows_it() -> None:
    total = report.Tally()
    report.add(total, report.Tally(records=1, seconds=2.0, steps=5, drafted=3, valid=1, digests=["a"]))
    report.add(total, report.Tally(records=1, seconds=1.5, steps=4, forced=2, invalid=["r2: cut"], digests=["b"]))
    assert (total.records, total.seconds, total.steps, total.drafted, total.valid) == (2, 3.5, 9, 3, 1)
    assert total.forced == 2 and total.expected_calls is None  # one knew the forced count; none knew the calls
    assert total.digests == ["a", "b"] and total.invalid == ["r2: cut"]


class FakeWorker:
    """A `Worker` that writes each call into a shared log and answers one second a record, 1 + i output tokens
    for record i (so sums and orders can be checked)."""

    def __init__(self, name: str, log: list[tuple[str, list[int], int, bool]]) -> None:
        self.name, self.log = name, log

    def run(self, task_set: str, records: list[int], batch_size: int, fresh: bool) -> report.Tally:
        self.log.append((self.name, records, batch_size, fresh))
        seconds = float(len(records)) * (2 if len(self.log) > 8 else 1)  # the last two calls take longer
        return report.Tally(records=len(records), seconds=seconds, output_tokens=sum(1 + i for i in records),
                            digests=[f"{self.name}{i}" for i in records])


def test_runs_interleave_record_by_record_in_turn_and_the_batched_run_twice(monkeypatch) -> None:
    monkeypatch.setattr(bench, "SETTLE_SECONDS", 0.0)
    log: list[tuple[str, list[int], int, bool]] = []
    workers = {name: FakeWorker(name, log) for name in ("A", "B")}
    items = records.task_items("extraction", 3)
    results = bench.interleaved(workers, {"extraction": items}, 32)  # type: ignore[arg-type]
    # B = 1: a record at a time, A then B, then B then A; each run's first call empties the prefix caches
    assert log[:6] == [("A", [0], 1, True), ("B", [0], 1, True), ("B", [1], 1, False), ("A", [1], 1, False),
                       ("A", [2], 1, False), ("B", [2], 1, False)]
    # the batched run twice, in opposite orders, every record in one call each time
    assert log[6:] == [("A", [0, 1, 2], 32, True), ("B", [0, 1, 2], 32, True), ("B", [0, 1, 2], 32, True),
                       ("A", [0, 1, 2], 32, True)]
    one, many = results["extraction"]["A"]
    assert (one.records, one.output_tokens, one.seconds, one.digests) == (3, 6, 3.0, ["A0", "A1", "A2"])
    assert many.records == 3 and many.digests == ["A0", "A1", "A2"]  # the first batched run's counts
    assert many.seconds == (3.0 + 6.0) / 2  # the mean of the two runs' seconds


class Holding:
    def __init__(self, size: int) -> None:
        self.size = size

    def memory(self) -> int:
        return self.size


def test_a_run_whose_workers_would_not_fit_in_memory_stops_naming_the_fix(monkeypatch) -> None:
    gib = 2**30
    up = {"A": Holding(6 * gib), "B": Holding(5 * gib)}
    monkeypatch.setattr(bench, "memory_available", lambda: 13 * gib)
    bench.check_memory(up, 2)  # type: ignore[arg-type]  # two more of the largest, 12 GiB, fit in 13
    with pytest.raises(SystemExit, match=r"3 configuration\(s\) still to start need about 18.0 GiB .* --configs"):
        bench.check_memory(up, 3)  # type: ignore[arg-type]
    bench.check_memory(up, 0)  # type: ignore[arg-type]  # none left to start
    monkeypatch.setattr(bench, "memory_available", lambda: None)  # no /proc/meminfo: nothing checked
    bench.check_memory(up, 9)  # type: ignore[arg-type]


def test_table_rows_compare_each_configuration_with_the_first() -> None:
    base = (report.Tally(records=2, seconds=8.0, output_tokens=100, steps=102, valid=2),
            report.Tally(records=2, seconds=2.0, output_tokens=100, steps=102, valid=2))
    faster = (report.Tally(records=2, seconds=4.0, output_tokens=100, steps=40, forced=30, drafted=50, accepted=20,
                          valid=2),
              report.Tally(records=2, seconds=4.0, output_tokens=100, steps=40, forced=30, drafted=30, accepted=10,
                          valid=1))
    rows = report.table_rows({"A": base, "B": faster, "C": (None, None)}, {"C": "not installed"})
    assert rows[0] == ["A", "4.000", "×1.00", "1.000", "×1.00", "1.020", "–", "–", "2/2", "2/2"]
    # B: 2 s a record against 4 (×2.00), 0.5 records/s against 1 (×0.50); acceptance over both runs: 30 of 80
    assert rows[1] == ["B", "2.000", "×2.00", "0.500", "×0.50", "0.400", "30.0%", "37.5% of 80", "2/2", "1/2"]
    assert rows[2][:2] == ["C", "skipped: not installed"] and len(rows[2]) == len(report.HEADER)


def test_ratios_are_against_the_first_configuration_that_ran() -> None:
    ran = (report.Tally(records=1, seconds=3.0), report.Tally(records=1, seconds=1.0))
    rows = report.table_rows({"skipped": (None, None), "A": ran, "B": ran}, {"skipped": "why"})
    assert rows[1][2] == rows[2][2] == "×1.00"


def test_markdown_has_a_header_row_per_column_and_the_totals() -> None:
    t = report.Tally(records=1, seconds=1.5, output_tokens=30, steps=31, engine_steps=31)
    text = report.markdown("extraction", {"A": (t, t)}, {}, 32)
    lines = text.splitlines()
    assert lines[0] == "### extraction"
    assert lines[2].count("|") == len(report.HEADER) + 1 and "records/s (B=32)" in lines[2]
    assert "- A: B=1: 30 output tokens, 31 record-steps, 31 engine steps, 1.5 s" in text


def test_the_tables_count_outputs_equal_to_those_without_drafts() -> None:
    base = report.Tally(records=3, digests=["a", "b", "c"])
    drafted, batched = report.Tally(records=3, digests=["a", "x", "c"]), report.Tally(records=3, digests=["a", "b", "c"])
    text = report.markdown("extraction", {"vLLM + structspec": (base, base),
                                          "vLLM + structspec + proposer": (drafted, batched)}, {}, 32)
    assert ("- vLLM + structspec + proposer: outputs token-identical to vLLM + structspec's in 2/3 at B=1, "
            "3/3 at B=32") in text
    assert "xgrammar" not in text  # a pair not run is not reported


# ---- step counting ----

def step(scheduled: dict[str, int], drafts: dict[str, int], sampled: dict[str, int],
         invalid: dict[str, int] | None = None) -> tuple[SimpleNamespace, SimpleNamespace]:
    """A SchedulerOutput and a ModelRunnerOutput with just what `observe` reads."""
    ids = list(scheduled)
    return (SimpleNamespace(num_scheduled_tokens=scheduled, total_num_scheduled_tokens=sum(scheduled.values()),
                            scheduled_spec_decode_tokens={r: [7] * n for r, n in drafts.items()},
                            num_invalid_spec_tokens=invalid),
            SimpleNamespace(req_id_to_index={r: i for i, r in enumerate(ids)},
                            sampled_token_ids=[[1] * sampled[r] for r in ids]))


def test_steps_drafts_and_accepted_tokens_are_counted_as_vllm_counts_them() -> None:
    counts = engine.StepCounts()
    engine.observe(counts, *step({}, {}, {}), 1)  # an empty step: no model ran
    engine.observe(counts, *step({"a": 17, "b": 9}, {}, {"a": 1, "b": 1}), 1)  # two prefills, one step
    engine.observe(counts, *step({"a": 5, "b": 1}, {"a": 4}, {"a": 3, "b": 1}), 1)  # a: 2 of 4 drafts accepted
    engine.observe(counts, *step({"a": 5}, {"a": 4}, {"a": 5}, invalid={"a": 1}), 1)  # 3 valid drafts, all taken
    assert counts.engine_steps == 3 and counts.request_steps == 5
    assert counts.per_request == {"a": 3, "b": 2}
    assert counts.drafted == 4 + 3 and counts.accepted == 2 + 4


def out(reason: str, stop: str | None) -> SimpleNamespace:
    """A vLLM CompletionOutput of three tokens that stopped for ``reason``."""
    return SimpleNamespace(token_ids=[5, 6, 2], finish_reason=reason, stop_reason=stop)


def test_an_output_counts_its_tokens_without_the_eos_that_ended_it() -> None:
    assert engine.output_tokens(out("stop", None)) == 2  # EOS
    assert engine.output_tokens(out("length", None)) == 3  # the budget ran out: every token is output
    assert engine.output_tokens(out("stop", "</s>")) == 3  # a stop string: not an EOS token


# ---- validity ----

def test_extraction_output_is_valid_when_it_validates() -> None:
    assert records.valid_json('{"city": "Oslo", "unit": "celsius"}', WEATHER)
    assert not records.valid_json('{"city": "Oslo", "unit": "kelvin"}', WEATHER)
    assert not records.valid_json('{"city": "Oslo", ', WEATHER)


def test_required_calls_parse_as_vllm_writes_them() -> None:
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo", "unit": "celsius"}}]'
    calls = records.vllm_calls(conversation("required"), text, REQUIRED)
    assert calls == [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]
    assert records.judge_calls(conversation("required"), calls) == (True, True)
    assert records.judge_calls(conversation("required", calls=2), calls) == (True, False)  # one call of two expected
    assert records.vllm_calls(conversation("required"), text.replace("celsius", "kelvin"), REQUIRED) is None


def test_named_and_auto_calls() -> None:
    named = records.vllm_calls(conversation("get_weather"), '{"city": "Oslo", "unit": "celsius"}', WEATHER)
    assert named == [{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}]
    tagged = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}</tool_call>'
    assert records.vllm_calls(conversation("auto"), tagged, None) == named
    answered = records.vllm_calls(conversation("auto"), "It is sunny.", None)
    assert records.judge_calls(conversation("auto"), answered) == (True, False)  # text, valid for auto: no call
    assert records.judge_calls(conversation("auto"), records.vllm_calls(conversation("auto"), tagged[:-3], None)) == \
        (True, False)  # a call cut before its end marker is no call
    broken = tagged.replace("celsius", "kelvin")
    assert records.judge_calls(conversation("auto"), records.vllm_calls(conversation("auto"), broken, None)) == \
        (False, False)


def test_own_loop_tally_reads_the_results_stats() -> None:
    item = records.Item("x", [], None, schema=WEATHER)
    stats = Stats(output_tokens=20, target_forward_passes=6, prefill_passes=1, forced_tokens=9,
                  drafts={"prompt_lookup": DraftStats(drafted=10, accepted=4), "forced": DraftStats(drafted=5,
                                                                                                     accepted=5)})
    good = SimpleNamespace(stats=stats, complete=True, text='{"city": "Oslo", "unit": "celsius"}', stop_reason="eos")
    cut = SimpleNamespace(stats=stats, complete=False, text='{"city": "Os', stop_reason="max_new_tokens")
    t = records.own_tally([item, item], [good, cut], 3.0)
    assert (t.records, t.seconds, t.output_tokens, t.steps, t.forced) == (2, 3.0, 40, 14, 18)
    assert (t.drafted, t.accepted, t.valid) == (20, 8, 1)  # forced splices are not drafts here
    assert t.invalid == ["x (stopped: max_new_tokens, 20 tokens): '{\"city\": \"Os'"]
    assert "    - invalid at B=1: x (stopped: max_new_tokens" in report.markdown("t", {"own": (t, None)}, {}, 32)


def test_records_spread_over_each_set() -> None:
    assert records.evenly(list(range(26)), 4) == [0, 6, 13, 19]
    assert records.evenly([1, 2], 5) == [1, 2]
    calls = records.toolcall_items(4)
    assert {item.conversation.choice for item in calls} >= {"auto", "required"}
    tasks = records.extraction_items(3)
    assert len({item.spec for item in tasks}) == 3 and all(item.schema["type"] == "object" for item in tasks)


def test_vllms_preload_keeps_the_users_own_last() -> None:
    libraries = bench.vllm_preload({"LD_PRELOAD": "/opt/mine.so"}).split(":")
    assert libraries[-1] == "/opt/mine.so" and len(libraries) == len(set(libraries))
    assert "/opt/mine.so" not in bench.vllm_preload({})


def test_the_prefix_jobs_prompt_ids_are_the_own_loops() -> None:
    from structspec.testing import tiny_lm

    lm = tiny_lm("byte_level")
    messages = [{"role": "user", "content": 'Read the ticket: {"id": 7}'}]
    assert engine.chat_ids(lm.tokenizer, messages) == lm.encode_prompt(messages)
