"""A seeded agent trace: chat requests from many tool-using conversations, in arrival order.

The trace is defined here, before any figure is taken from it, and is a pure function of its
seed: ``agent_trace(seed)`` gives the same requests on every machine.

* ``conversations`` conversations (24 by default), each of one of three agents (a travel desk,
  a code-review bot, a data analyst). Every request of a conversation starts with its agent's
  system prompt and tool schema (JSON), several hundred tokens, repeated verbatim.
* Each conversation runs 5 to 15 turns. A turn is one request: the conversation so far, ending
  in a user message or a tool result; the model writes the next assistant message. Between
  turns the trace's own assistant message (a tool call, or a short answer) and the tool's result
  are appended, so the conversation does not depend on what the model wrote.
* Tool calls and results come from a small per-agent table, so some repeat within and across
  conversations (the same city's weather, the same file read twice), as agent loops do.
* Conversations are interleaved: at each arrival a random unfinished conversation sends its next
  turn, so the first half of the trace (which warms a cross-request pool) and the second half
  (which is measured) each hold turns of most conversations.

Tool calls and results are written into user/assistant messages (``<tool_call>`` and
``Tool result``) so that any chat template renders them.
"""

from __future__ import annotations

import json
import random
from typing import Any

import attrs

SEED = 2026

_AGENTS = {
    "travel": {
        "intro": "You are TripDesk, a travel assistant for a corporate travel team. Answer in short sentences. "
                 "When you need data, call exactly one tool by writing <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> "
                 "and wait for its result. Never invent prices, times or availability: always look them up. "
                 "Prefer direct flights, then the cheapest fare; hotels within two kilometres of the meeting venue.",
        "tools": [
            ("search_flights", "Search scheduled flights between two airports on a date.",
             {"origin": "IATA airport code of departure", "destination": "IATA airport code of arrival",
              "date": "departure date, YYYY-MM-DD", "cabin": "economy, premium or business"}),
            ("get_weather", "Current weather and a three-day forecast for a city.",
             {"city": "city name in English", "units": "metric or imperial"}),
            ("search_hotels", "Hotels near a place, with nightly rates and distance.",
             {"near": "address or landmark", "check_in": "YYYY-MM-DD", "nights": "number of nights",
              "max_rate": "highest nightly rate in EUR"}),
            ("book", "Book an offer returned by search_flights or search_hotels.",
             {"offer_id": "the id of the offer", "traveller": "full name as in the passport"}),
            ("convert_currency", "Convert an amount between currencies at today's rate.",
             {"amount": "number", "from": "ISO currency code", "to": "ISO currency code"}),
        ],
        "asks": ["I need to be in Berlin for a meeting on 2026-12-14, flying from Amsterdam. Find me a flight.",
                 "What will the weather be like in Lisbon this week? I am packing for a conference.",
                 "Find a hotel near the Messe in Frankfurt for three nights from 2026-12-08.",
                 "Book the cheapest direct flight from Madrid to Paris on 2026-12-10 for Ana Ruiz.",
                 "How much is 1200 USD in EUR today? It is for a hotel deposit.",
                 "Plan my trip to Vienna: flight from Zurich on 2026-12-15 and a hotel near the Hofburg."],
        "calls": [("get_weather", {"city": "Lisbon", "units": "metric"}),
                  ("get_weather", {"city": "Berlin", "units": "metric"}),
                  ("search_flights", {"origin": "AMS", "destination": "BER", "date": "2026-12-14", "cabin": "economy"}),
                  ("search_flights", {"origin": "MAD", "destination": "CDG", "date": "2026-12-10", "cabin": "economy"}),
                  ("search_hotels", {"near": "Messe Frankfurt", "check_in": "2026-12-08", "nights": 3, "max_rate": 180}),
                  ("convert_currency", {"amount": 1200, "from": "USD", "to": "EUR"})],
    },
    "review": {
        "intro": "You are LintBot, a code-review assistant for a Python monorepo. Be precise and brief. "
                 "To inspect the repository call one tool at a time as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> "
                 "and wait for the result. Quote file paths and line numbers exactly as the tools return them. "
                 "Flag bugs first, then style; never suggest changes to generated files under build/.",
        "tools": [
            ("read_file", "Read a file of the repository, optionally a line range.",
             {"path": "path from the repository root", "start": "first line (1-based)", "end": "last line"}),
            ("grep", "Search the repository for a regular expression.",
             {"pattern": "a Python regular expression", "glob": "file glob, e.g. src/**/*.py"}),
            ("run_tests", "Run pytest on a path and return the summary and failures.",
             {"path": "test file or folder", "keyword": "optional -k expression"}),
            ("git_diff", "The diff of the pull request against its base branch.",
             {"path": "optional path filter", "context": "lines of context"}),
            ("post_comment", "Post a review comment on a line of the diff.",
             {"path": "file path", "line": "line number", "body": "the comment in Markdown"}),
        ],
        "asks": ["Review pull request 418: it changes the retry logic in src/net/client.py.",
                 "Why does tests/test_cache.py fail on the main branch since this morning?",
                 "Find every caller of parse_config and check they handle a missing file.",
                 "Check the new CSV exporter in src/export/csv_writer.py for quoting bugs.",
                 "Does the PR keep the public API of src/net/client.py unchanged?"],
        "calls": [("git_diff", {"path": "src/net/client.py", "context": 3}),
                  ("read_file", {"path": "src/net/client.py", "start": 40, "end": 80}),
                  ("grep", {"pattern": "parse_config\\(", "glob": "src/**/*.py"}),
                  ("run_tests", {"path": "tests/test_cache.py", "keyword": ""}),
                  ("read_file", {"path": "src/export/csv_writer.py", "start": 1, "end": 60})],
    },
    "analyst": {
        "intro": "You are DataDesk, an analyst assistant with read access to the sales warehouse. "
                 "Answer with numbers and one sentence of interpretation. Call tools as "
                 "<tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, one at a time, and wait for the result. "
                 "Only SELECT statements are allowed; always add a LIMIT; dates are in UTC.",
        "tools": [
            ("list_tables", "List the warehouse tables with their row counts.", {"schema": "schema name, default sales"}),
            ("describe_table", "Columns, types and a sample row of a table.", {"table": "table name"}),
            ("run_sql", "Run a read-only SQL query and return at most 50 rows.",
             {"query": "a SELECT statement", "timeout_s": "seconds before the query is cancelled"}),
            ("plot", "Render a chart from the last query's rows.",
             {"kind": "line, bar or scatter", "x": "column for the x axis", "y": "column for the y axis"}),
        ],
        "asks": ["What were total sales by region last quarter?",
                 "Which ten products had the largest drop in units sold month over month?",
                 "Show weekly revenue for 2026 as a line chart.",
                 "How many orders were refunded in November, and what share of revenue is that?",
                 "Compare average basket size between web and store orders this year."],
        "calls": [("list_tables", {"schema": "sales"}),
                  ("describe_table", {"table": "orders"}),
                  ("run_sql", {"query": "SELECT region, SUM(amount) AS total FROM orders WHERE quarter = '2026Q3' GROUP BY region LIMIT 50", "timeout_s": 30}),
                  ("run_sql", {"query": "SELECT channel, AVG(amount) AS basket FROM orders WHERE year = 2026 GROUP BY channel LIMIT 50", "timeout_s": 30}),
                  ("plot", {"kind": "line", "x": "week", "y": "revenue"})],
    },
}


@attrs.frozen
class TraceRequest:
    """One request of the trace: the conversation so far, to be answered by the model."""

    index: int  # arrival order
    conversation: int
    turn: int  # 0-based within the conversation
    agent: str
    messages: tuple  # ({"role", "content"}, ...) ending in a user message


def system_prompt(agent: str) -> str:
    """The agent's system prompt with its tool schema (repeated verbatim in every request)."""
    spec = _AGENTS[agent]
    tools = [{"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in params.items()},
        "required": list(params)}}} for name, desc, params in spec["tools"]]
    return f"{spec['intro']}\n\nTools:\n{json.dumps(tools, indent=1)}"


def _result(name: str, args: dict) -> str:
    """A tool result: deterministic for the same call (repeated calls repeat their results)."""
    local = random.Random(json.dumps([name, args], sort_keys=True))
    if name == "get_weather":
        days = [{"day": d, "high_c": local.randint(4, 19), "low_c": local.randint(-3, 8), "sky": local.choice(["sunny", "cloudy", "rain", "showers"])}
                for d in ("today", "tomorrow", "day after")]
        return json.dumps({"city": args["city"], "forecast": days})
    if name == "search_flights":
        offers = [{"offer_id": f"FL{local.randint(1000, 9999)}", "depart": f"{h:02d}:{local.choice(['05', '20', '35', '50'])}",
                   "stops": local.choice([0, 0, 1]), "fare_eur": local.randint(79, 420)} for h in sorted(local.sample(range(6, 21), 3))]
        return json.dumps({"route": f"{args['origin']}-{args['destination']}", "date": args["date"], "offers": offers})
    if name == "search_hotels":
        hotels = [{"offer_id": f"HT{local.randint(1000, 9999)}", "name": f"Hotel {local.choice(['Am Ring', 'Central', 'Park', 'Messe Inn'])}",
                   "km": round(local.uniform(0.2, 2.5), 1), "rate_eur": local.randint(89, 180)} for _ in range(3)]
        return json.dumps({"near": args["near"], "hotels": hotels})
    if name == "convert_currency":
        return json.dumps({"amount": args["amount"], "from": args["from"], "to": args["to"], "result": round(args["amount"] * 0.93, 2)})
    if name == "git_diff":
        return ("diff --git a/src/net/client.py b/src/net/client.py\n@@ -52,7 +52,9 @@ class Client:\n"
                "-        for attempt in range(3):\n+        for attempt in range(self.retries):\n"
                "+            delay = min(2 ** attempt, 30)\n             try:\n                 return self._send(request)\n")
    if name == "read_file":
        lines = [f"{args['start'] + i}: " + local.choice(["    def _send(self, request):", "        return self.session.post(url, data)",
                                                          "    retries = 3", "        raise TimeoutError(url)", "    writer.writerow(row)"])
                 for i in range(6)]
        return "\n".join(lines)
    if name == "grep":
        return "\n".join(f"src/{p}.py:{local.randint(10, 300)}: cfg = parse_config(path)" for p in ("app/main", "cli/run", "jobs/nightly"))
    if name == "run_tests":
        return f"{local.randint(20, 40)} passed, 1 failed: tests/test_cache.py::test_expiry - AssertionError: 299 != 300"
    if name == "list_tables":
        return json.dumps({"tables": [{"name": t, "rows": local.randint(10_000, 9_000_000)} for t in ("orders", "products", "refunds", "stores")]})
    if name == "describe_table":
        return json.dumps({"table": args["table"], "columns": {"id": "bigint", "region": "text", "channel": "text", "amount": "numeric",
                                                                "quarter": "text", "week": "int", "year": "int"}})
    if name == "run_sql":
        return json.dumps({"rows": [{"key": k, "value": local.randint(10_000, 900_000)} for k in ("north", "south", "east", "west")]})
    return json.dumps({"ok": True, "chart": f"{args.get('kind', 'line')} chart rendered"})


def _conversation(rng: random.Random, agent: str) -> list[tuple]:
    """The messages after the system prompt, as (kind, message) steps: each 'ask' step is a
    request boundary (the model answers the conversation up to and including it)."""
    spec = _AGENTS[agent]
    turns = rng.randint(5, 15)
    steps: list[tuple] = [("ask", {"role": "user", "content": rng.choice(spec["asks"])})]
    while sum(kind == "ask" for kind, _ in steps) < turns:
        name, args = rng.choice(spec["calls"])
        call = json.dumps({"name": name, "arguments": args})
        steps.append(("say", {"role": "assistant", "content": f"<tool_call>{call}</tool_call>"}))
        steps.append(("ask", {"role": "user", "content": f"Tool result ({name}):\n{_result(name, args)}"}))
        if rng.random() < 0.25 and sum(kind == "ask" for kind, _ in steps) < turns:
            steps.append(("say", {"role": "assistant", "content": "Done. Here is what I found, in short."}))
            steps.append(("ask", {"role": "user", "content": rng.choice(spec["asks"])}))
    return steps


def agent_trace(seed: int = SEED, conversations: int = 24) -> list[TraceRequest]:
    """The trace's requests in arrival order (see the module docstring)."""
    rng = random.Random(seed)
    agents = sorted(_AGENTS)
    plans = []
    for c in range(conversations):
        agent = agents[c % len(agents)]
        plans.append((agent, [{"role": "system", "content": system_prompt(agent)}], _conversation(rng, agent)))
    cursor = [0] * conversations
    asked = [0] * conversations
    out: list[TraceRequest] = []
    while True:
        live = [c for c in range(conversations) if cursor[c] < len(plans[c][2])]
        if not live:
            return out
        c = rng.choice(live)
        agent, messages, steps = plans[c]
        while cursor[c] < len(steps):
            kind, message = steps[cursor[c]]
            messages.append(message)
            cursor[c] += 1
            if kind == "ask":
                out.append(TraceRequest(len(out), c, asked[c], agent, tuple(dict(m) for m in messages)))
                asked[c] += 1
                break


def prose_prompts(count: int) -> list[list[dict[str, Any]]]:
    """Unrelated prose requests (the control: nothing of the trace helps them)."""
    topics = ("the history of the bicycle", "how bees make honey", "the first transatlantic telegraph",
              "why the sky is blue", "the invention of paper", "life on a medieval farm", "how glaciers move",
              "the rules of chess", "the story of the printing press", "how volcanoes form")
    return [[{"role": "user", "content": f"Write a short essay about {topics[i % len(topics)]}."}] for i in range(count)]
