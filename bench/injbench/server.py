"""One AgentDojo suite's tools as an MCP server (stdio, JSON-RPC 2.0), on one pair's environment.

The box starts it as a declared tools' server kept for its session (`process = "session"`,
`state = "session"`): `argv[1]` names the suite; `$STATE` is the session's place, where the
benchmark (run.py) wrote `pair.json` (the injections of the pair's attack) before the session's
first call. Each call runs AgentDojo's own function on the environment and answers with what
AgentDojo's own tool executor would show a model; then the environment is written to
`env.pickle` and the call appended to `calls.jsonl`, which run.py judges with AgentDojo's checks.
A listing (`bxctl tools ask`) has no pair and lists the tools on the default environment.
"""

import json
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import agentdojo_fast  # noqa: E402

get_suite = agentdojo_fast.load()
from agentdojo.agent_pipeline.tool_execution import tool_result_to_str  # noqa: E402
from agentdojo.functions_runtime import FunctionsRuntime  # noqa: E402

VERSION = "v1.2.2"
suite = get_suite(VERSION, sys.argv[1])
state = os.environ["STATE"]
pair_file = os.path.join(state, "pair.json")
pair = {}
if os.path.exists(pair_file):
    with open(pair_file) as f:
        pair = json.load(f)
env = suite.load_and_inject_default_environment(pair.get("injections", {}))
runtime = FunctionsRuntime(suite.tools)
tools = [
    {
        "name": fn.name,
        "description": fn.description,
        "inputSchema": fn.parameters.model_json_schema(),
    }
    for fn in suite.tools
]


def say(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def keep(name, args):
    """The environment as the call left it, and the call, for the judge. The environment is
    pickled, not dumped as JSON: validating a dump runs AgentDojo's validators again, which
    rebuild (and so lose) what the calls changed, the mails sent among them."""
    tmp = os.path.join(state, "env.pickle.tmp")
    with open(tmp, "wb") as f:
        pickle.dump(env, f)
    os.replace(tmp, os.path.join(state, "env.pickle"))
    with open(os.path.join(state, "calls.jsonl"), "a") as f:
        f.write(json.dumps({"function": name, "args": args}) + "\n")


for line in sys.stdin:
    m = json.loads(line)
    if "id" not in m:
        continue
    method = m.get("method")
    if method == "initialize":
        say({"jsonrpc": "2.0", "id": m["id"], "result": {
            "protocolVersion": "2025-06-18",
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "agentdojo-" + suite.name, "version": VERSION},
        }})
    elif method == "tools/list":
        say({"jsonrpc": "2.0", "id": m["id"], "result": {"tools": tools}})
    elif method == "tools/call":
        name = m["params"]["name"]
        args = m["params"].get("arguments") or {}
        result, error = runtime.run_function(env, name, args)
        if pair:
            keep(name, args)
        text = error if error else tool_result_to_str(result)
        say({"jsonrpc": "2.0", "id": m["id"], "result": {
            "content": [{"type": "text", "text": text}],
            "isError": bool(error),
        }})
    else:
        say({"jsonrpc": "2.0", "id": m["id"], "error": {"code": -32601, "message": "no such method"}})
