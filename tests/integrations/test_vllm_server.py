"""The OpenAI-compatible server under the structspec backend, started with the command docs/guides/vllm.md gives
(read from the page: CI runs it as documented), on vLLM's CPU build and SmolLM2-135M (converted), driven with the
``openai`` client. One server for the module. Skipped where vLLM is not installed."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here: .ci/vllm-check runs this module in .venv-vllm")

import jsonschema  # noqa: E402
import openai  # noqa: E402

from tests.integrations.test_vllm import PERSON, TOOLS, closed_keys  # noqa: E402
from tests.integrations.test_vllm_proposer import smollm2_dir  # noqa: E402

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "vllm.md"
STRICT_TOOLS = [{**t, "function": {**t["function"], "strict": True}} for t in TOOLS]  # arguments held to the schema
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
WEATHER = [{"role": "user", "content": "What is the weather in Oslo, in celsius? Use a tool."}]


def documented_command() -> list[str]:
    """The guide's server command (its ```bash block that runs structspec.integrations.vllm_cli), as argv."""
    blocks = re.findall(r"```bash\n(.*?)```", GUIDE.read_text(encoding="utf-8"), re.S)
    command = next(b for b in blocks if "structspec.integrations.vllm_cli serve" in b)
    return shlex.split(command.replace("\\\n", " "))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def client(isolated_cache: str) -> Iterator[openai.OpenAI]:
    """A client of one server, started as documented (``python`` this interpreter, ``MODEL`` SmolLM2-135M's
    directory) on a free port; stopped, with its engine process, after the module."""
    argv = documented_command()
    env = dict(os.environ)
    while "=" in argv[0]:  # (the command's environment assignments)
        name, value = argv.pop(0).split("=", 1)
        env[name] = value
    assert argv[:4] == ["python", "-m", "structspec.integrations.vllm_cli", "serve"], argv
    port = free_port()
    argv = [sys.executable, *argv[1:]]
    argv[argv.index("MODEL")] = smollm2_dir()
    server = subprocess.Popen([*argv, "--host", "127.0.0.1", "--port", str(port)], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_until_healthy(server, port)
        yield openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # (the server's session: the API server and its engine process)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def wait_until_healthy(server: subprocess.Popen, port: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise AssertionError(f"the server exited with {server.returncode}:\n{server.stderr.read()[-4000:]}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(2)
    raise AssertionError(f"the server did not answer /health within {timeout} s")


def chat(client: openai.OpenAI, messages: list[dict[str, Any]], max_tokens: int = 120, **options: Any) -> Any:
    """One greedy chat completion's first choice."""
    model = client.models.list().data[0].id
    return client.chat.completions.create(model=model, messages=messages, max_tokens=max_tokens, temperature=0,
                                          **options).choices[0]


def test_response_format_json_schema_validates(client: openai.OpenAI) -> None:
    choice = chat(client, [{"role": "user", "content": "A user record as JSON."}], max_tokens=200,
                  response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    assert choice.finish_reason == "stop", choice.message.content
    value = json.loads(choice.message.content)
    jsonschema.validate(value, PERSON)
    assert closed_keys(value, PERSON)


def test_structured_outputs_regex_matches(client: openai.OpenAI) -> None:
    regex = r"[0-9]{3}-[0-9]{4}"
    choice = chat(client, [{"role": "user", "content": "Give me a phone number."}], max_tokens=20,
                  extra_body={"structured_outputs": {"regex": regex}})
    assert re.fullmatch(regex, choice.message.content), choice.message.content


def calls_of(choice: Any) -> list[tuple[str, Any]]:
    """The message's tool calls as (name, parsed arguments), each checked against its tool's schema."""
    calls = [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls or []]
    for name, arguments in calls:
        jsonschema.validate(arguments, PARAMETERS[name])
    return calls


@pytest.mark.parametrize("tools", [TOOLS, STRICT_TOOLS], ids=["tools", "strict tools"])
def test_tool_choice_required_calls_a_tool(client: openai.OpenAI, tools: list[dict[str, Any]]) -> None:
    choice = chat(client, WEATHER, tools=tools, tool_choice="required")
    if tools is TOOLS:  # (not strict: vLLM constrains the call, not its arguments, as under xgrammar)
        names = [c.function.name for c in choice.message.tool_calls]
    else:
        names = [name for name, _ in calls_of(choice)]
    assert names and set(names) <= set(PARAMETERS), choice


def test_a_named_tool_is_the_one_called(client: openai.OpenAI) -> None:
    choice = chat(client, WEATHER, tools=STRICT_TOOLS, tool_choice={"type": "function", "function": {"name": "add"}})
    assert [name for name, _ in calls_of(choice)] == ["add"], choice


@pytest.mark.parametrize("tools", [TOOLS, STRICT_TOOLS], ids=["tools", "strict tools"])
def test_tool_choice_auto_answers_in_text_or_valid_calls(client: openai.OpenAI, tools: list[dict[str, Any]]) -> None:
    choice = chat(client, WEATHER, max_tokens=60, tools=tools, tool_choice="auto")  # (strict: a structural tag)
    assert choice.message.content or calls_of(choice), choice


@pytest.mark.parametrize("structured, fix", [
    ({"json": {"type": "integer", "multipleOf": 3}}, "'multipleOf' at /: not enforced for type 'integer'; remove it "
                                                     "from the schema, or start vLLM with structured_outputs_config="
                                                     "{'backend': 'xgrammar'}"),
    ({"grammar": 'root ::= "yes" | "no"'}, "start vLLM with structured_outputs_config={'backend': 'xgrammar'}"),
])
def test_a_bad_request_is_a_400_naming_the_fix_and_the_server_goes_on(
    client: openai.OpenAI, structured: dict[str, Any], fix: str,
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, [{"role": "user", "content": "x"}], max_tokens=5, extra_body={"structured_outputs": structured})
    assert refused.value.status_code == 400 and fix in str(refused.value), refused.value
    choice = chat(client, [{"role": "user", "content": "Yes or no?"}], max_tokens=5,
                  extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
    assert choice.message.content in ("yes", "no")
