#!/usr/bin/env python3
"""`ds4 serve` through the official `openai` Python client.

Run by cli/tests/serve.rs (`cargo test -p ds4 --test serve`), which starts the server
and passes its address in DS4_BASE_URL (e.g. http://127.0.0.1:PORT/v1). To run it by
hand against a binary, set DS4_BIN=target/release/ds4 instead: the script then starts
`ds4 serve --port 0` itself.

The server runs the embedded default model (random weights): its text is noise, but
deterministic at temperature 0, so the checks compare answers rather than read them.
If the `openai` package is missing this prints SKIP and exits 0; CI installs it.
"""

import json
import os
import subprocess
import sys
import threading
import time
import unittest
import urllib.request

try:
    import openai
except ImportError:
    print("SKIP: the 'openai' Python package is not installed (pip install openai); "
          "the openai-client tests of ds4 serve did not run")
    sys.exit(0)

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

_server = None


def base_url():
    """The server's /v1 address: given, or from a server this script starts."""
    global _server
    url = os.environ.get("DS4_BASE_URL")
    if url:
        return url
    binary = os.environ.get("DS4_BIN")
    if not binary:
        sys.exit("set DS4_BASE_URL to a running `ds4 serve`, or DS4_BIN to the ds4 binary")
    _server = subprocess.Popen([binary, "serve", "--port", "0", "--parallel", "4"],
                               stderr=subprocess.PIPE, text=True)
    for line in _server.stderr:
        if "listening on http://" in line:
            addr = line.split("listening on http://")[1].split()[0]
            # Keep draining stderr so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in _server.stderr], daemon=True).start()
            return f"http://{addr}/v1"
    sys.exit("ds4 serve did not start")


URL = base_url()
client = openai.OpenAI(base_url=URL, api_key="not-needed", max_retries=0, timeout=120)
MODEL = client.models.list().data[0].id


def health():
    root = URL[: -len("/v1")] if URL.endswith("/v1") else URL
    with urllib.request.urlopen(root + "/health", timeout=30) as r:
        return json.loads(r.read())


def extra(obj, name):
    """A field the OpenAI schema does not define (e.g. reasoning_content)."""
    value = getattr(obj, name, None)
    if value is None and getattr(obj, "model_extra", None):
        value = obj.model_extra.get(name)
    return value


def chat(messages, **kw):
    kw.setdefault("temperature", 0)
    kw.setdefault("max_tokens", 12)
    return client.chat.completions.create(model=MODEL, messages=messages, **kw)


def user(text):
    return [{"role": "user", "content": text}]


def collect_stream(stream):
    """(content, reasoning, finish_reason, usage, tool-call deltas) of a chat stream."""
    content, reasoning, finish, usage, calls = "", "", None, None, []
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            d = choice.delta
            content += d.content or ""
            reasoning += extra(d, "reasoning_content") or ""
            calls += d.tool_calls or []
            finish = choice.finish_reason or finish
    return content, reasoning, finish, usage, calls


class OpenAIClient(unittest.TestCase):
    def test_models(self):
        ids = [m.id for m in client.models.list().data]
        self.assertEqual(ids, [MODEL])
        self.assertEqual(client.models.retrieve(MODEL).id, MODEL)

    def test_chat_streamed_and_not(self):
        r = chat(user("Hello!"), reasoning_effort="none")
        msg = r.choices[0].message
        self.assertEqual(msg.role, "assistant")
        self.assertIsInstance(msg.content, str)
        self.assertEqual(r.usage.prompt_tokens, 6)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))

        s = chat(user("Hello!"), reasoning_effort="none", stream=True, stream_options={"include_usage": True})
        content, reasoning, finish, usage, _ = collect_stream(s)
        self.assertEqual(content, msg.content)
        self.assertEqual(reasoning, "")
        self.assertEqual(finish, r.choices[0].finish_reason)
        self.assertEqual((usage.prompt_tokens, usage.completion_tokens),
                         (r.usage.prompt_tokens, r.usage.completion_tokens))

    def test_reasoning_content(self):
        r = chat(user("Why is the sky blue?"), reasoning_effort="high", max_tokens=10)
        msg = r.choices[0].message
        content, reasoning, _, _, _ = collect_stream(
            chat(user("Why is the sky blue?"), reasoning_effort="high", max_tokens=10, stream=True))
        self.assertEqual(reasoning, extra(msg, "reasoning_content") or "")
        self.assertEqual(content, msg.content)
        # DeepSeek's own switch does the same.
        r2 = chat(user("Why is the sky blue?"), max_tokens=10, extra_body={"thinking": {"type": "enabled"}})
        self.assertEqual(extra(r2.choices[0].message, "reasoning_content"), extra(msg, "reasoning_content"))

    def test_sampling_is_seeded(self):
        kw = dict(reasoning_effort="none", temperature=1.3, top_p=0.9, seed=1234, max_tokens=10)
        a = chat(user("Pick a word."), **kw).choices[0].message.content
        b = chat(user("Pick a word."), **kw).choices[0].message.content
        self.assertEqual(a, b)
        self.assertEqual(chat(user("x"), extra_body={"min_p": 0.2}, **kw).choices[0].message.role, "assistant")

    def test_stop(self):
        full = chat(user("Count."), reasoning_effort="none", max_tokens=16).choices[0].message.content
        self.assertGreaterEqual(len(full), 6, full)
        stop = full[len(full) // 2: len(full) // 2 + 2]
        r = chat(user("Count."), reasoning_effort="none", max_tokens=16, stop=stop)
        self.assertEqual(r.choices[0].message.content, full[: full.index(stop)])
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_max_tokens(self):
        r = chat(user("Write an essay."), reasoning_effort="none", max_completion_tokens=3)
        self.assertEqual(r.usage.completion_tokens, 3)
        self.assertEqual(r.choices[0].finish_reason, "length")

    def test_tool_call_round_trip(self):
        messages = user("What is the weather in Paris?")
        r = chat(messages, tools=[WEATHER_TOOL], max_tokens=24,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
        choice = r.choices[0]
        self.assertIn(choice.finish_reason, ("tool_calls", "stop", "length"))
        if choice.message.tool_calls:
            call = choice.message.tool_calls[0]
            self.assertEqual(call.function.name, "get_weather")
            json.loads(call.function.arguments)
            calls = [c.model_dump() for c in choice.message.tool_calls]
        else:
            # The random model did not finish the call: send back the one it should have made.
            calls = [{"id": "call_0", "type": "function",
                      "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]
        messages = messages + [
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": json.dumps({"temp_c": 21})},
        ]
        r2 = chat(messages, tools=[WEATHER_TOOL], max_tokens=8)
        self.assertIsNotNone(r2.choices[0].message)
        self.assertGreater(r2.usage.prompt_tokens, r.usage.prompt_tokens)
        # Streamed, with tools offered.
        _, _, finish, _, deltas = collect_stream(chat(messages, tools=[WEATHER_TOOL], max_tokens=8, stream=True))
        self.assertIn(finish, ("tool_calls", "stop", "length"))
        for d in deltas:
            json.loads(d.function.arguments)

    def test_legacy_completions(self):
        r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
        self.assertIsInstance(r.choices[0].text, str)
        self.assertEqual(r.usage.completion_tokens + r.usage.prompt_tokens, r.usage.total_tokens)
        s = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0, stream=True)
        self.assertEqual("".join(c.choices[0].text for c in s if c.choices), r.choices[0].text)

    def test_errors(self):
        for kw in (dict(temperature=5), dict(n=2), dict(top_p=0), dict(max_tokens=0), dict(stop=["a", "b", "c", "d", "e"])):
            with self.assertRaises(openai.BadRequestError, msg=str(kw)) as ctx:
                chat(user("hi"), **kw)
            self.assertEqual(ctx.exception.status_code, 400)
            self.assertTrue(ctx.exception.body["message"])
        with self.assertRaises(openai.BadRequestError):
            chat([])
        with self.assertRaises(openai.NotFoundError):
            client.models.retrieve("no-such-model")
        self.assertEqual(health()["status"], "ok")
        self.assertEqual(chat(user("still fine?"), max_tokens=2).choices[0].message.role, "assistant")

    def test_concurrent_clients(self):
        prompts = [f"Tell me about the number {i}." for i in range(4)]
        alone = [chat(user(p), reasoning_effort="none", max_tokens=8).choices[0].message.content for p in prompts]
        together = [None] * len(prompts)
        barrier = threading.Barrier(len(prompts))

        def run(i):
            barrier.wait()
            together[i] = chat(user(prompts[i]), reasoning_effort="none", max_tokens=8).choices[0].message.content

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(together, alone)

    def test_closing_a_stream_cancels_it(self):
        before = health()["cancelled"]
        stream = chat(user("Go on forever."), reasoning_effort="none", max_tokens=1_000_000, stream=True)
        for i, _ in enumerate(stream):
            if i == 3:
                break
        stream.close()
        deadline = time.time() + 20
        while time.time() < deadline:
            h = health()
            if h["cancelled"] > before:
                return
            time.sleep(0.05)
        self.fail(f"the generation went on after the client closed its stream: {health()}")


if __name__ == "__main__":
    print(f"openai {openai.__version__} against {URL} (model {MODEL!r})")
    try:
        result = unittest.main(verbosity=2, exit=False).result
    finally:
        if _server is not None:
            _server.terminate()
            _server.wait(timeout=30)
    sys.exit(0 if result.wasSuccessful() else 1)
