"""Function tools: plain typed functions with a Google-style docstring.

    actor_rollout_ref.rollout.multi_turn.function_tool_path=docs/examples/agent_function_tools.py

The JSON schema each tool shows the model is built from the signature and the docstring
(`transformers.utils.get_json_schema`): every parameter needs a type hint and an `Args:` line.
Names must not repeat a tool of the tool config yaml.
"""

from __future__ import annotations

import asyncio

from verl.tools.function_tool import function_tool


@function_tool
def word_count(text: str) -> int:
    """Count the words of a text.

    Args:
        text: the text to count the words of.
    """
    return len(text.split())


@function_tool("capital_of")
async def lookup_capital(country: str) -> str:
    """Look up the capital city of a country.

    Args:
        country: the country's English name, e.g. "France".
    """
    await asyncio.sleep(0)  # an async tool may await I/O without blocking other trajectories
    capitals = {"france": "Paris", "japan": "Tokyo", "kenya": "Nairobi"}
    return capitals.get(country.strip().lower(), f"Error: no capital known for {country!r}")
