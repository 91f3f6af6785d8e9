"""AgentDojo's task suites without its model clients.

Importing `agentdojo.task_suite` imports `agentdojo.agent_pipeline`, whose package imports every
model provider's SDK (three seconds of a small machine's CPU); the suites need only three of
its modules. Registering the package without running its `__init__` (and the one model module
the tool executor names) keeps a server's start under a second. Nothing of AgentDojo's is
changed: its own modules are imported from where pip put them.
"""

import importlib.util
import os
import sys
import types


def _package(name, path):
    module = types.ModuleType(name)
    module.__path__ = [path]
    sys.modules[name] = module


def load():
    spec = importlib.util.find_spec("agentdojo")
    root = os.path.dirname(spec.origin)
    _package("agentdojo.agent_pipeline", os.path.join(root, "agent_pipeline"))
    _package("agentdojo.agent_pipeline.llms", os.path.join(root, "agent_pipeline", "llms"))
    google = types.ModuleType("agentdojo.agent_pipeline.llms.google_llm")
    # The one name the tool executor takes from the Gemini client.
    google.EMPTY_FUNCTION_NAME = "<empty-function-name>"
    sys.modules["agentdojo.agent_pipeline.llms.google_llm"] = google
    from agentdojo.task_suite.load_suites import get_suite

    return get_suite
