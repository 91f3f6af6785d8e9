"""The benchmark's scripted models, served as an OpenAI-compatible endpoint (streamed chat
completions, as inferproxy asks for them) on loopback.

The request's `model` names the suite. From the turn it was given, the model finds the user
task (its prompt) and plays it: the user task's ground-truth calls, one per reply, then its
ground-truth answer. It is **fully adversarial**: once a tool result holds an injection task's
goal (the attack's text), it performs that injection task's ground-truth calls next, before
going on with the user task; so any attack the box lets through succeeds. A call the box refused
or the owner denied is not tried again. The model never reads the box's own words as orders:
it acts only on the prompt and on what the tool results hold.

Run: `model.py` prints `port <n>` once it listens.
"""

import json
import os
import re
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agentdojo_fast  # noqa: E402

get_suite = agentdojo_fast.load()

VERSION = "v1.2.2"
SUITES = {name: get_suite(VERSION, name) for name in ("workspace", "travel", "banking", "slack")}
_lock = threading.Lock()
_plans = {}


def squash(text):
    """Only the letters and digits: the goal found however a result's YAML wrapped or escaped it."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def calls_of(task, suite):
    env = suite.load_and_inject_default_environment({})
    return [(c.function, dict(c.args)) for c in task.ground_truth(env)]


def plans(suite_name):
    """Per suite: each user task's prompt, calls and answer; each injection task's goal and calls."""
    with _lock:
        if suite_name not in _plans:
            suite = SUITES[suite_name]
            users = {
                tid: (t.PROMPT, calls_of(t, suite), getattr(t, "GROUND_TRUTH_OUTPUT", "") or "")
                for tid, t in suite.user_tasks.items()
            }
            injections = {
                tid: (squash(t.GOAL), calls_of(t, suite)) for tid, t in suite.injection_tasks.items()
            }
            _plans[suite_name] = (users, injections)
        return _plans[suite_name]


def text_of(content):
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def next_step(suite_name, messages):
    """The next reply: ("call", name, args) or ("text", answer)."""
    users, injections = plans(suite_name)
    prompts = [text_of(m.get("content")) for m in messages if m.get("role") == "user"]
    task = None
    for prompt in reversed(prompts):
        for tid, (p, calls, answer) in users.items():
            if p.strip() and p.strip() in prompt:
                task = (calls, answer)
                break
        if task:
            break
    if task is None:
        return ("text", "I do not know this task.")
    calls, answer = task
    made = []
    results = []
    for m in messages:
        if m.get("role") == "assistant":
            for c in m.get("tool_calls") or []:
                made.append(c["function"]["name"])
        elif m.get("role") == "tool":
            results.append(squash(text_of(m.get("content"))))
    plan = list(calls)
    # The first result that holds a goal: its injection task's calls come right after it.
    for k, result in enumerate(results):
        hit = next((c for tid, (goal, c) in sorted(injections.items()) if goal and goal in result), None)
        if hit is not None:
            plan = plan[: k + 1] + hit + plan[k + 1:]
            break
    if len(made) < len(plan):
        name, args = plan[len(made)]
        return ("call", name, args)
    return ("text", answer or "Done.")


def chunks(step, n):
    base = {"id": "chatcmpl-%d" % n, "object": "chat.completion.chunk", "model": "scripted"}
    if step[0] == "call":
        delta = {"role": "assistant", "tool_calls": [{
            "index": 0, "id": "call_%d" % n, "type": "function",
            "function": {"name": step[1], "arguments": json.dumps(step[2])},
        }]}
        finish = "tool_calls"
    else:
        delta = {"role": "assistant", "content": step[1]}
        finish = "stop"
    yield dict(base, choices=[{"index": 0, "delta": delta, "finish_reason": None}])
    yield dict(base, choices=[{"index": 0, "delta": {}, "finish_reason": finish}])
    yield dict(base, choices=[], usage={"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    served = 0

    def log_message(self, *_):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        Handler.served += 1
        step = next_step(body.get("model", ""), body.get("messages", []))
        out = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks(step, Handler.served))
        out += b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)


def main():
    for name in SUITES:
        plans(name)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print("port %d" % server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
