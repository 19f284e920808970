"""The Redis commands a message costs, pinned: a change that adds or removes any fails here until the table follows.

A whole gateway runs as an operator runs it (a private valkey, the fake Telegram Bot API, ``python -m switchboard
web`` and ``python -m switchboard worker``, the offline model). The test watches the server with ``MONITOR`` and counts
every command the web and worker processes issue while a scenario's messages go through; commands run inside a Lua
script appear in ``MONITOR`` under their own names (client ``lua``) and are counted as well, attributed to the process
whose ``EVALSHA`` ran them. ``EVALSHA`` is counted per script (``EVALSHA ingest``). Each scenario's window is cut by two
``ECHO`` markers this test sends, so it holds exactly the commands the server executed in between; the server's own
``INFO commandstats``, reset at the window's start, must agree with it (so nothing escaped the log).

What is not counted, and why (the rest is deterministic; several runs in a row give the same table):

- timers, made too long to tick during the test through the settings (:data:`QUIET_TIMERS`): the worker's heartbeat,
  liveness key and takeover check, the reaper's sweep, the scheduler's look for due jobs, the session lease renewal;
- ``LMPOP``: the worker's safety pass (a wake-up lost) runs once a heartbeat, made too long to tick here; it is not
  counted should one fall in a window anyway (the drains come through their shard's wake-up and ``EVALSHA take``);
- ``PING``, ``HELLO``, ``CLIENT``: redis-py's health check of a connection idle for 30 s, and the handshake of a
  connection a pool opens (when depends on how work overlapped).

Two things follow the clock and are pinned by the scenarios instead: a Telegram chat's streaming edit budget (one edit
a second) is full before each one-at-a-time message, as in a human-paced chat, and spent during the backlog's drain;
the send rates are off (``send_rate: 0`` in the benchmarks' configuration, whose agent has ``current_time`` as its
one tool), since a paced send retries on a timer.

To update the table after a deliberate change: run this test, and paste the table its failure message prints over
:data:`PINNED` (the message also says which commands went up or down, and what each feature costs over the plain path).
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
import redis
import yaml

from bench._harness import MINIMAL_CONFIG, PYTHON, SECRET_TOKEN, Proc, bench_env, free_port, start_redis
from switchboard.channels.telegram.fake.platform import make_update
from switchboard.core.sealing import new_key
from switchboard.queue import scripts
from switchboard.queue.embedded import EmbeddedRedis, find_server_binary
from switchboard.queue.keys import GlobalKeys, ShardKeys
from tests.failover.servers import Node

# Calls per message, by scenario. "commands": every command (inside scripts too) by name, EVALSHA by script;
# "total": their sum; "client": the commands clients sent (not those run inside scripts; a pipeline of 3 counts 3);
# "web" / "worker": the total split by the process that issued it, "web_client" / "worker_client" the client ones.
# Scenarios: "plain" a Telegram text message, one at a time, abuse limits off, no tool call; "limits" the same with
# the abuse limits on; "backlog" BACKLOG messages drained together; "webchat" a web chat message, one at a time;
# "tool_call" a Telegram message whose turn calls one tool (current_time); "access_allowlist" the plain path with
# ``access: {mode: allowlist}`` admitting the sender; "access_paired" with ``mode: pairing`` and the sender paired
# (found paired less than ``recheck_s`` ago); "access_recheck" the same with ``recheck_s: 0`` (looked up every message);
# "budgets" the plain message under three period budgets (tenant, agent, user: the person lookup, one read, one
# charge); "group_ignored" a group message that does not address the bot (default ``group_replies``: ignored, nothing
# written); "group_context_kept" the same with ``group_replies.keep_context`` on (kept as context, no run); "routing"
# the plain message with a ``routing`` binding it does not match and an agent that may hand over (the conversation's
# handoff binding read); "voice" the plain message with the agent's ``voice: {mode: always}`` (the reply spoken by a
# fake OpenAI speech route and sent after the text: the voice send's outbox claim and record, and its facts);
# "retention_sealed" the plain message with retention rules for every kind and SWITCHBOARD_DATA_KEYS set (history
# sealed): the same commands as "plain"; "sampled" the plain message with ``SWITCHBOARD_EVALS__SAMPLE_RATE=1`` (every
# finished run queued for review: one pipelined push and trim; at rate 0, the default every other scenario runs with,
# nothing); "ack_replicas" the plain message with ``SWITCHBOARD_QUEUE__ACK_REPLICAS=1`` and a replica attached (a WAIT
# after the ingest script, and after the send's claim and record in the worker). Minus "plain": what the feature costs.
# "limits" checks the per-sender meter in a script of its own on the sender's slot before ingest (issue #26: a sender
# writes into several sessions, so its meter is in no session's slot): one more round trip and 3 more commands than
# when ingest read it (EVALSHA sender_meter, its TIME and GET; ingest's MGET of both meters became a GET). With
# messages_per_sender_per_minute 0 it costs nothing.
# Segmented metrics (switchboard/queue/segments.py) ride inside the script that already writes a turn's closing facts
# (outbox_claim or facts), so they add no round trip: a metered turn adds one HINCRBY (its duration's bucket, by agent,
# version and tenant: the turn count and p50/p95) and one HINCRBYFLOAT (the duration's sum); a priced turn (tool credits
# included) one HINCRBYFLOAT more (its cost); each tool outcome, retried tool, approval asked or budget stop one HINCRBY
# more, only when the turn had one; a failed or cancelled run one HINCRBY inside the fail/complete script (none here).
# UPDATE: run `pytest tests/perf/test_command_counts.py` and paste the table from its failure message over this one.
PINNED: dict[str, dict[str, Any]] = {
    "access_allowlist": {
        "client": 6,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 66,
        "web": 14,
        "web_client": 1,
        "worker": 52,
        "worker_client": 5,
    },
    "access_paired": {
        "client": 6,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 66,
        "web": 14,
        "web_client": 1,
        "worker": 52,
        "worker_client": 5,
    },
    "access_recheck": {
        "client": 7,
        "commands": {
            "DEL": 1,
            "EVALSHA access_check": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 3,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 68,
        "web": 16,
        "web_client": 2,
        "worker": 52,
        "worker_client": 5,
    },
    "ack_replicas": {
        "client": 9,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "WAIT": 3,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 69,
        "web": 15,
        "web_client": 2,
        "worker": 54,
        "worker_client": 7,
    },
    "backlog": {
        "client": 4.2,
        "commands": {
            "DEL": 0.1,
            "EVALSHA begin": 0.1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 0.1,
            "EXISTS": 0.1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 0.1,
            "LINDEX": 1,
            "LLEN": 1.1,
            "LPOP": 1.1,
            "LRANGE": 1,
            "RPUSH": 2.1,
            "SET": 2.1,
            "SPUBLISH": 0.1,
            "XADD": 7,
            "ZADD": 2.1,
            "ZCARD": 1,
            "ZREM": 0.2,
        },
        "total": 54.3,
        "web": 12.2,
        "web_client": 1,
        "worker": 42.1,
        "worker_client": 3.2,
    },
    "budgets": {
        "client": 9,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA budget_charge": 1,
            "EVALSHA budget_read": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "EXPIREAT": 3,
            "GET": 4,
            "HDEL": 3,
            "HGET": 3,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 8,
            "HMGET": 6,
            "HSET": 9,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 6,
            "ZCARD": 1,
            "ZREM": 2,
            "ZREMRANGEBYSCORE": 1,
        },
        "total": 87,
        "web": 14,
        "web_client": 1,
        "worker": 73,
        "worker_client": 8,
    },
    "group_context_kept": {
        "client": 1,
        "commands": {
            "EVALSHA context_keep": 1,
            "EXPIRE": 1,
            "LTRIM": 1,
            "RPUSH": 1,
            "SET": 1,
            "XADD": 1,
        },
        "total": 6,
        "web": 6,
        "web_client": 1,
    },
    "group_ignored": {
        "client": 0,
        "commands": {},
        "total": 0,
    },
    "limits": {
        "client": 7,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA sender_meter": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 6,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 3,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 5,
            "SPUBLISH": 1,
            "TIME": 2,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 74,
        "web": 22,
        "web_client": 2,
        "worker": 52,
        "worker_client": 5,
    },
    "plain": {
        "client": 6,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 66,
        "web": 14,
        "web_client": 1,
        "worker": 52,
        "worker_client": 5,
    },
    "retention_sealed": {
        "client": 6,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 66,
        "web": 14,
        "web_client": 1,
        "worker": 52,
        "worker_client": 5,
    },
    "routing": {
        "client": 7,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 5,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 67,
        "web": 15,
        "web_client": 2,
        "worker": 52,
        "worker_client": 5,
    },
    "sampled": {
        "client": 8,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 4,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LPUSH": 1,
            "LRANGE": 1,
            "LTRIM": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 7,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 68,
        "web": 14,
        "web_client": 1,
        "worker": 54,
        "worker_client": 7,
    },
    "tool_call": {
        "client": 8,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA fenced_xadd": 2,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 6,
            "HDEL": 3,
            "HGET": 2,
            "HGETALL": 1,
            "HINCRBY": 10,
            "HINCRBYFLOAT": 5,
            "HMGET": 3,
            "HSET": 6,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 9,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 75,
        "web": 14,
        "web_client": 1,
        "worker": 61,
        "worker_client": 7,
    },
    "voice": {
        "client": 9,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 1,
            "EVALSHA complete": 1,
            "EVALSHA facts": 1,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_claim": 2,
            "EVALSHA outbox_record": 2,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 7,
            "HDEL": 3,
            "HGET": 4,
            "HGETALL": 1,
            "HINCRBY": 11,
            "HINCRBYFLOAT": 3,
            "HMGET": 3,
            "HSET": 8,
            "INCR": 1,
            "LINDEX": 1,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 9,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 80,
        "web": 14,
        "web_client": 1,
        "worker": 66,
        "worker_client": 8,
    },
    "webchat": {
        "client": 12,
        "commands": {
            "DEL": 1,
            "EVALSHA begin": 2,
            "EVALSHA complete": 1,
            "EVALSHA fenced_xadd": 3,
            "EVALSHA ingest": 1,
            "EVALSHA outbox_append": 1,
            "EVALSHA outbox_claim": 1,
            "EVALSHA outbox_record": 1,
            "EVALSHA take": 1,
            "EXISTS": 1,
            "GET": 9,
            "HDEL": 3,
            "HGET": 3,
            "HGETALL": 1,
            "HINCRBY": 9,
            "HINCRBYFLOAT": 3,
            "HMGET": 4,
            "HSET": 7,
            "INCR": 1,
            "LINDEX": 2,
            "LLEN": 2,
            "LPOP": 2,
            "LRANGE": 1,
            "PEXPIRE": 3,
            "RPUSH": 3,
            "SET": 3,
            "SPUBLISH": 1,
            "XADD": 13,
            "XDEL": 1,
            "ZADD": 3,
            "ZCARD": 1,
            "ZREM": 2,
        },
        "total": 90,
        "web": 20,
        "web_client": 1,
        "worker": 70,
        "worker_client": 11,
    },
}


MESSAGES = 3
"""Counted messages in each one-at-a-time scenario (after one uncounted message that opens the session)."""
BACKLOG = 10
"""Messages queued in one session while the worker is stopped, then drained."""
QUIET_TIMERS = {
    "SWITCHBOARD_QUEUE__LEASE_MS": "600000",
    "SWITCHBOARD_QUEUE__WORKER_HEARTBEAT_MS": "200000",
    "SWITCHBOARD_QUEUE__REAPER_INTERVAL_S": "6000",
    "SWITCHBOARD_QUEUE__SCHEDULE_POLL_S": "6000",
}
"""Timers long enough not to tick while the test runs (heartbeat and takeover every 100-200 s, reaper and the
scheduler's look for due jobs 6,000 s)."""
LIMITS_OFF = {
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "0",
    "SWITCHBOARD_LIMITS__INBOX_DEPTH": "0",
    "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "0",
}
RETENTION = """\
retention:
  defaults: {history: 30d, events: 30d, dead_letters: 30d, approvals: 30d, workspaces: 30d}
"""
"""Retention rules for every kind (their sweep runs at the worker's start; the test waits for it to end)."""
BUDGETS = """\
prices:
  offline: {input: 1.0, output: 1.0}
budgets:
  - {scope: tenant, period: month, credits: 1000000}
  - {scope: agent, period: day, credits: 1000000}
  - {scope: user, period: day, credits: 1000000}
"""
"""The "budgets" scenario: a tenant, an agent and a user budget (never reached), metered at a price."""
ROUTING = """\
    handoff: {to: [billing], history: summary}
  billing:
    profile: {name: Billing}
    instructions: You answer billing questions.
routing:
  - {match: {keyword: invoice}, agent: billing}
"""
"""The "routing" scenario: a keyword binding the message does not match, and an agent that may hand over (the
conversation's handoff binding is read for every message)."""
VOICE = yaml.safe_load(MINIMAL_CONFIG)
VOICE["agents"]["assistant"]["voice"] = {"mode": "always"}
"""The "voice" scenario's YAML file: every reply also spoken."""
LIMITS_ON = {
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SESSION_PER_MINUTE": "1000000",
    "SWITCHBOARD_LIMITS__MESSAGES_PER_SENDER_PER_MINUTE": "1000000",
    "SWITCHBOARD_LIMITS__INBOX_DEPTH": "1000000",
    "SWITCHBOARD_LIMITS__SESSIONS_PER_ADDRESS_PER_HOUR": "0",
}
"""Limits checked on every message but never reached (as in ``bench/_stack.py``)."""
NOT_COUNTED = frozenset({"LMPOP", "PING", "HELLO", "CLIENT"})
"""Commands left out by name (see the module docstring)."""
SCRIPT_NAMES = {script.sha: script.name for script in scripts.ALL}


# ---------------------------------------------------------------- the command log


@dataclass
class Seen:
    """One command as ``MONITOR`` showed it."""

    port: str
    """The client's port, or ``lua`` for a command run inside a script."""
    name: str


@dataclass
class CommandLog:
    """Every command the server executes, from a ``MONITOR`` connection read on a thread."""

    url: str
    seen: list[Seen] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _markers: dict[str, int] = field(default_factory=dict)
    _marked: threading.Condition = field(init=False)

    def __post_init__(self) -> None:
        self._marked = threading.Condition(self._lock)
        self._client = redis.Redis.from_url(self.url, socket_timeout=None)  # quiet while web and worker restart
        self._monitor = self._client.monitor()
        self._monitor.__enter__()
        self._thread = threading.Thread(target=self._read, name="monitor", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        with contextlib.suppress(redis.ConnectionError, OSError, ValueError):
            while True:
                entry = self._monitor.next_command()
                words = str(entry["command"]).split(" ", 2)
                name = words[0].upper()
                if name == "EVALSHA" and len(words) > 1:
                    name = f"EVALSHA {SCRIPT_NAMES.get(words[1], '?' + words[1][:8])}"
                port = "lua" if entry.get("client_type") == "lua" else str(entry.get("client_port", ""))
                with self._marked:
                    if name == "ECHO" and len(words) > 1 and words[1].startswith("sbcount:"):
                        self._markers[words[1]] = len(self.seen)
                        self._marked.notify_all()
                    else:
                        self.seen.append(Seen(port, name))

    def mark(self, control: redis.Redis, timeout: float = 10.0) -> int:
        """Send a marker through ``control`` and wait until the monitor saw it; the log's length at that point."""
        marker = f"sbcount:{uuid.uuid4().hex}"
        control.echo(marker)
        with self._marked:
            if not self._marked.wait_for(lambda: marker in self._markers, timeout):
                raise AssertionError("MONITOR did not show the marker")
            return self._markers[marker]

    def between(self, start: int, end: int) -> list[Seen]:
        """The commands seen between two markers."""
        with self._lock:
            return list(self.seen[start:end])

    def close(self) -> None:
        """Stop reading."""
        with contextlib.suppress(Exception):
            self._monitor.connection.disconnect()  # type: ignore[attr-defined]
        self._client.close()
        self._thread.join(5)


# ---------------------------------------------------------------- the gateway


def redis_ports(proc: Proc, redis_port: int) -> set[str]:
    """The local ports of ``proc``'s connections to the Redis server (its clients as MONITOR names them)."""
    return {
        str(conn.laddr.port)
        for conn in psutil.Process(proc.pid).net_connections("tcp")
        if conn.raddr and conn.raddr.port == redis_port
    }


@dataclass
class Gateway:
    """Redis, the fake Bot API, and (re)startable web and worker processes."""

    tmp: Path
    server: EmbeddedRedis
    fake: Proc
    fake_url: str
    control: redis.Redis
    log: CommandLog
    web: Proc | None = None
    worker: Proc | None = None
    web_url: str = ""
    ports: dict[str, str] = field(default_factory=dict)
    """Client port → ``web`` / ``worker``, learnt as the processes open connections."""
    since: int = 0
    """The fake's last call sequence number already read."""
    env: dict[str, str] = field(default_factory=dict)
    """The environment web and worker were started with."""
    generation: int = 0

    def start(
        self, extra: dict[str, str], access: dict[str, Any] | None = None, groups: dict[str, Any] | None = None
    ) -> None:
        """Start (or restart) ``switchboard web`` and ``switchboard worker`` with ``extra`` settings.

        ``access``, ``groups``: the Telegram channel's ``access`` and ``group_replies`` blocks in the YAML file.
        """
        self.stop()
        self.generation += 1
        port = free_port()
        data = self.tmp / f"data{self.generation}"
        env = {**bench_env(self.server.url, data, port=port, telegram_url=self.fake_url), **QUIET_TIMERS, **extra}
        if access is not None or groups is not None:
            config = yaml.safe_load(MINIMAL_CONFIG)
            if access is not None:
                config["channels"]["telegram"]["access"] = access
            if groups is not None:
                config["channels"]["telegram"]["group_replies"] = groups
            path = self.tmp / f"access{self.generation}.yaml"
            path.write_text(yaml.safe_dump(config))
            env["SWITCHBOARD_CONFIG"] = str(path)
        self.env = env
        self.web = Proc(f"web{self.generation}", [PYTHON, "-m", "switchboard", "web"], env=env, log_dir=self.tmp)
        self.web_url = f"http://127.0.0.1:{port}"
        self.web.wait_http(f"{self.web_url}/healthz")
        self.worker = Proc(
            f"worker{self.generation}", [PYTHON, "-m", "switchboard", "worker"], env=env, log_dir=self.tmp
        )
        deadline = time.monotonic() + 30
        while _get_json(f"{self.web_url}/healthz").get("workers", 0) < 1:
            assert self.worker.popen.poll() is None, self.worker.tail()
            assert time.monotonic() < deadline, f"no live worker:\n{self.worker.tail()}"
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop web and worker, if running."""
        for proc in (self.worker, self.web):
            if proc is not None:
                proc.stop()
        self.web = self.worker = None

    def learn_ports(self) -> None:
        """Note which process each client port belongs to."""
        assert self.web is not None and self.worker is not None
        port = int(self.server.port or 0)
        for role, proc in (("web", self.web), ("worker", self.worker)):
            self.ports.update(dict.fromkeys(redis_ports(proc, port), role))

    def telegram(self, chat_id: int, update_id: int, text: str, chat_type: str = "private") -> None:
        """Post one signed Telegram update; it must be accepted."""
        update = make_update(
            text,
            chat_id=chat_id,
            update_id=update_id,
            chat_type=chat_type,
            user_id=None if chat_type == "private" else 4242,
            first_name="Count",
            username="count_user",
        )
        headers = {"Content-Type": "application/json", "X-Telegram-Bot-Api-Secret-Token": SECRET_TOKEN}
        status, _ = _post(f"{self.web_url}/webhooks/telegram", update, headers)
        assert status == 200, f"the gateway answered {status}"

    def replies(self) -> int:
        """Messages the bot sent since the last call (``sendMessage`` calls the fake recorded)."""
        return len(self.reply_texts())

    def reply_texts(self) -> list[str]:
        """The texts the bot sent since the last call."""
        with urllib.request.urlopen(f"{self.fake_url}/_fake/calls?since={self.since}&method=sendMessage") as resp:
            calls = json.loads(resp.read())
        self.since = max([self.since, *(int(c["seq"]) for c in calls)])
        return [str(c.get("params", {}).get("text", "")) for c in calls]

    def pair(self, chat_id: int) -> None:
        """Refuse a stranger in ``pairing`` mode, then approve the code it was given (``switchboard access``)."""
        self.telegram(chat_id, chat_id * 100 - 1, "let me in")
        deadline = time.monotonic() + 10
        texts: list[str] = []
        while not any("pairing code is" in t for t in texts):
            assert time.monotonic() < deadline, "no pairing code was sent"
            texts += self.reply_texts()
            time.sleep(0.02)
        code = next(t for t in texts if "pairing code is" in t).split("pairing code is ")[1][:7]
        done = subprocess.run(
            [PYTHON, "-m", "switchboard", "access", "approve", code], env=self.env, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr

    def edit_budget(self, chat_id: int) -> str:
        """The key of a Telegram chat's streaming edit budget (a GCRA meter: one edit a second, burst 1)."""
        return GlobalKeys().chat_edit_rate("telegram", "default", str(chat_id))

    def refill_edit_budget(self, chat_id: int) -> None:
        """Fill the chat's edit budget, as a pause of a second would (a GCRA meter is full once its key is gone).

        Then the next reply's first streamed edit is granted and the others refused, every time: how many edits a
        reply gets otherwise depends on how long ago the last one was (one a second).
        """
        self.control.delete(self.edit_budget(chat_id))

    def spend_edit_budget(self, chat_id: int, seconds: float = 60.0) -> None:
        """Empty the chat's edit budget for ``seconds``: every streamed edit is refused meanwhile.

        The meter holds its next arrival time in ms of the server's clock (``_limits.lua``).
        """
        now_s, now_us = self.control.time()
        tat_ms = int(now_s) * 1000 + int(now_us) // 1000 + int(seconds * 1000)
        self.control.set(self.edit_budget(chat_id), tat_ms, px=int(seconds * 1000))

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        """Wait until the worker's log holds ``text``."""
        assert self.worker is not None
        deadline = time.monotonic() + timeout
        while text not in self.worker.log.read_text(errors="replace"):
            assert time.monotonic() < deadline, f"the worker never logged {text!r}:\n{self.worker.tail()}"
            time.sleep(0.05)

    def wait_idle(self, timeout: float = 30.0) -> None:
        """Wait until no session is runnable (the worker has nothing left).

        A drain's entry leaves its shard's running set in the step that releases the session, so no runnable session
        means no drain queued or running.
        """
        deadline = time.monotonic() + timeout
        while True:
            with self.control.pipeline(transaction=False) as pipe:
                for shard in ShardKeys.every():
                    pipe.zcard(shard.runnable)
                if not any(pipe.execute()):
                    return
            assert time.monotonic() < deadline, (
                f"the worker did not go idle:\n{self.worker.tail() if self.worker else ''}"
            )
            time.sleep(0.02)

    @contextlib.contextmanager
    def counting(self, into: dict[str, Counter[str]], scenario: str, messages: int) -> Iterator[None]:
        """Count what the gateway sends Redis while the block runs (which must leave the gateway idle)."""
        self.control.config_resetstat()
        start = self.log.mark(self.control)
        yield
        self.wait_idle()
        time.sleep(0.2)  # a straggler would show here, and make the runs disagree
        end = self.log.mark(self.control)
        stats = self.control.info("commandstats")
        self.learn_ports()
        mine = str(self.control.client_info()["addr"]).rsplit(":", 1)[-1]
        counts: Counter[str] = Counter()
        polled: Counter[str] = Counter()
        caller = ""
        for seen in self.log.between(start, end):
            if seen.port != "lua":
                caller = seen.port  # a script's commands follow the EVALSHA that ran them
            if caller == mine:
                polled[seen.name.lower()] += 1
                continue
            if seen.name in NOT_COUNTED:
                continue
            owner = self.ports.get(caller, f"other:{caller}")
            counts[f"cmd:{seen.name}"] += 1
            counts[f"role:{owner}"] += 1
            if seen.port != "lua":
                counts["client"] += 1
                counts[f"role:{owner}_client"] += 1
        counts["messages"] = messages
        into[scenario] = counts
        cross_check(counts, polled, stats)


def cross_check(counts: Counter[str], polled: Counter[str], stats: dict[str, Any]) -> None:
    """The server's own ``INFO commandstats`` (reset at the start of the window) agrees with what MONITOR showed.

    So no command escaped the log, and the commands run inside scripts are those the server counts. ``polled``: the
    commands this test sent meanwhile (by name), which the server counts too.
    """
    seen: Counter[str] = Counter()
    for key, value in counts.items():
        if key.startswith("cmd:"):
            seen[key[4:].split(" ", 1)[0].lower()] += value
    server = {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) - polled[name] for name in seen}
    assert server == dict(seen), "MONITOR and INFO commandstats disagree"


def _post(url: str, payload: Any, headers: dict[str, str]) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(request, timeout=10) as resp:
        return int(resp.status), json.loads(resp.read() or b"null")


def _get_json(url: str) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError), urllib.request.urlopen(url, timeout=2) as resp:
        return dict(json.loads(resp.read()))
    return {}


@contextlib.contextmanager
def gateway(tmp: Path) -> Iterator[Gateway]:
    """A private Redis (no other test shares it: MONITOR sees the whole server), the fake, and the command log."""
    server = start_redis(tmp, None)
    fake_port = free_port()
    fake = Proc("fake", [PYTHON, "-m", "bench._servers", "fake-telegram", "--port", str(fake_port)], log_dir=tmp)
    control = redis.Redis.from_url(server.url)
    log = None
    gw = None
    try:
        fake_url = f"http://127.0.0.1:{fake_port}"
        fake.wait_http(f"{fake_url}/_fake/calls")
        log = CommandLog(server.url)
        gw = Gateway(tmp, server, fake, fake_url, control, log)
        yield gw
    finally:
        if gw is not None:
            gw.stop()
        if log is not None:
            log.close()
        control.close()
        fake.stop()
        server.stop()


@contextlib.contextmanager
def replica_of(server: EmbeddedRedis, root: Path) -> Iterator[Node]:
    """A replica of ``server`` (the same binary), streaming from it before the block runs."""
    port = urllib.parse.urlsplit(server.url).port
    assert port is not None
    node = Node(free_port(), root)
    node.start(find_server_binary(), "--replicaof", "127.0.0.1", str(port))
    try:
        node.wait_ready()
        with redis.Redis.from_url(server.url) as primary:
            deadline = time.monotonic() + 20
            while primary.execute_command("WAIT", 1, 100) < 1:
                assert time.monotonic() < deadline, "the replica did not attach"
        yield node
    finally:
        node.stop()


# ---------------------------------------------------------------- scenarios


def one_at_a_time(gw: Gateway, into: dict[str, Counter[str]], scenario: str, chat_id: int, text: str) -> None:
    """One uncounted message opens the session; then :data:`MESSAGES`, each answered before the next is sent."""
    update = chat_id * 100
    gw.telegram(chat_id, update, text)
    gw.wait_idle()
    assert gw.replies() >= 1, "no reply to the first message"
    with gw.counting(into, scenario, MESSAGES):
        for n in range(1, MESSAGES + 1):
            gw.refill_edit_budget(chat_id)
            gw.telegram(chat_id, update + n, text)
            gw.wait_idle()
    assert gw.replies() == MESSAGES, f"{scenario}: expected one reply per message"


def group_chatter(gw: Gateway, into: dict[str, Counter[str]], scenario: str, chat_id: int) -> None:
    """Group messages that do not address the bot: one uncounted, then :data:`MESSAGES` (none starts a run).

    A private message is answered first, uncounted: the worker's start-up commands (the reaper's lock, the stop
    listener's ``SUBSCRIBE``) are then behind it, as the other scenarios' first answered message puts them.
    """
    update = abs(chat_id) * 100
    gw.telegram(abs(chat_id) + 10_000, 5_000_000 + abs(chat_id), "hello there")  # a chat and update of its own
    gw.wait_idle()
    assert gw.replies() >= 1, f"{scenario}: the warm-up message was not answered"
    gw.telegram(chat_id, update, "just chatting", chat_type="supergroup")
    gw.wait_idle()
    with gw.counting(into, scenario, MESSAGES):
        for n in range(1, MESSAGES + 1):
            gw.telegram(chat_id, update + n, "just chatting", chat_type="supergroup")
    assert gw.replies() == 0, f"{scenario}: a message that did not address the bot was answered"


def backlog(gw: Gateway, into: dict[str, Counter[str]]) -> None:
    """:data:`BACKLOG` messages queue in one session while the worker is frozen; then it drains them.

    The chat's edit budget is spent first, so no streamed edit is granted during the drain: otherwise one would be
    for each second the drain lasts (the first reply of a fast drain takes the budget, and the others find it spent).
    """
    assert gw.worker is not None
    chat_id = 303
    gw.telegram(chat_id, chat_id * 100, "hello there")
    gw.wait_idle()
    gw.replies()
    gw.spend_edit_budget(chat_id)
    with gw.counting(into, "backlog", BACKLOG):
        gw.worker.popen.send_signal(signal.SIGSTOP)
        try:
            for n in range(1, BACKLOG + 1):
                gw.telegram(chat_id, chat_id * 100 + n, "hello there")
        finally:
            gw.worker.popen.send_signal(signal.SIGCONT)
    assert gw.replies() >= 1, "no reply to the backlog"


def webchat(gw: Gateway, into: dict[str, Counter[str]]) -> None:
    """A web chat session (uncounted: opened, one message), then :data:`MESSAGES` posts, each answered first."""
    status, session = _post(f"{gw.web_url}/api/chat/sessions", {}, {"Content-Type": "application/json"})
    assert status == 201
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {session['token']}"}

    def post(n: int) -> None:
        status, _ = _post(f"{gw.web_url}/api/chat/messages", {"text": "hello there", "client_id": f"c{n}"}, headers)
        assert status == 202

    post(0)
    gw.wait_idle()
    with gw.counting(into, "webchat", MESSAGES):
        for n in range(1, MESSAGES + 1):
            post(n)
            gw.wait_idle()


# ---------------------------------------------------------------- the table


def per_message(counts: Counter[str]) -> dict[str, Any]:
    """A scenario's row: calls per message (two decimals when a drain shares work between messages)."""
    n = counts["messages"]

    def each(value: int) -> int | float:
        return value // n if value % n == 0 else round(value / n, 2)

    commands = {key[4:]: each(v) for key, v in sorted(counts.items()) if key.startswith("cmd:")}
    row: dict[str, Any] = {"commands": commands, "total": each(sum(counts[f"cmd:{c}"] for c in commands))}
    row["client"] = each(counts["client"])
    for key, value in sorted(counts.items()):
        if key.startswith("role:"):
            row[key[5:]] = each(value)
    return row


def differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``name: a → b (+d)`` for every figure of two rows that differs."""
    out = []
    flat_old = {**{k: v for k, v in old.items() if k != "commands"}, **old.get("commands", {})}
    flat_new = {**{k: v for k, v in new.items() if k != "commands"}, **new.get("commands", {})}
    for name in sorted(flat_old.keys() | flat_new.keys()):
        a, b = flat_old.get(name, 0), flat_new.get(name, 0)
        if a != b:
            out.append(f"    {name}: {a} → {b} ({b - a:+g})")
    return out


def report(measured: dict[str, dict[str, Any]]) -> str:
    """The failure message: what changed, each feature's cost over the plain path, and the table to paste."""
    lines = ["Redis commands per message differ from the pinned table.", "", "Changes (pinned → measured):"]
    for scenario in sorted(measured.keys() | PINNED.keys()):
        changed = differences(PINNED.get(scenario, {}), measured.get(scenario, {}))
        if changed:
            lines += [f"  {scenario}:", *changed]
    lines += ["", "Each scenario over the plain path (plain → scenario):"]
    for scenario in sorted(measured.keys() - {"plain"}):
        lines += [f"  {scenario}:", *differences(measured["plain"], measured[scenario])]
    lines += ["", "If the change is deliberate, paste this over PINNED in tests/perf/test_command_counts.py:", ""]
    lines.append(f"PINNED: dict[str, dict[str, Any]] = {literal(measured)}")
    return "\n".join(lines)


def literal(value: Any, indent: str = "") -> str:
    """``value`` as Python source the way ``ruff format`` leaves it (one key a line, trailing commas)."""
    if not isinstance(value, dict):
        return repr(value)
    inner = indent + "    "
    items = "".join(f"{inner}{json.dumps(key)}: {literal(item, inner)},\n" for key, item in sorted(value.items()))
    return "{\n" + items + indent + "}"


@contextlib.contextmanager
def fake_speech() -> Iterator[str]:
    """OpenAI's speech route faked on a loopback port, served from a thread of this process; yields its ``/v1`` URL."""
    import asyncio

    from aiohttp import web

    from tests.fakes.openai_api import FakeOpenAI

    loop = asyncio.new_event_loop()
    runner = web.AppRunner(FakeOpenAI().app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", 0).start())
    port = runner.addresses[0][1]
    thread = threading.Thread(target=loop.run_forever, name="fake-openai", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


@pytest.mark.timeout(600)  # fifteen scenarios, each starting a web and a worker process: minutes on a busy host
def test_redis_commands_per_message_match_the_pinned_table(tmp_path: Path) -> None:
    counts: dict[str, Counter[str]] = {}
    with gateway(tmp_path) as gw:
        gw.start(LIMITS_OFF)
        one_at_a_time(gw, counts, "plain", 101, "hello there")
        one_at_a_time(gw, counts, "tool_call", 505, "what time is it")
        webchat(gw, counts)
        backlog(gw, counts)
        gw.start(LIMITS_ON)
        one_at_a_time(gw, counts, "limits", 202, "hello there")
        gw.start(LIMITS_OFF, access={"mode": "allowlist", "allow": ["telegram:606"]})
        one_at_a_time(gw, counts, "access_allowlist", 606, "hello there")
        gw.start(LIMITS_OFF, access={"mode": "pairing"})
        gw.pair(707)
        one_at_a_time(gw, counts, "access_paired", 707, "hello there")  # the uncounted first one finds it paired
        gw.start(LIMITS_OFF, access={"mode": "pairing", "pairing": {"recheck_s": 0}})
        gw.pair(808)
        one_at_a_time(gw, counts, "access_recheck", 808, "hello there")
        budgets = tmp_path / "budgets.yaml"
        budgets.write_text(MINIMAL_CONFIG + BUDGETS)
        gw.start({**LIMITS_OFF, "SWITCHBOARD_CONFIG": str(budgets)})
        one_at_a_time(gw, counts, "budgets", 909, "hello there")  # update ids above the others' (Telegram's order)
        gw.start(LIMITS_OFF)
        group_chatter(gw, counts, "group_ignored", -1001)
        gw.start(LIMITS_OFF, groups={"keep_context": {"enabled": True}})
        group_chatter(gw, counts, "group_context_kept", -1002)
        routing = tmp_path / "routing.yaml"
        tools = "    tools: [current_time]\n"
        routing.write_text(MINIMAL_CONFIG.replace(tools, tools + ROUTING))
        gw.start({**LIMITS_OFF, "SWITCHBOARD_CONFIG": str(routing)})
        one_at_a_time(gw, counts, "routing", 1001, "hello there")
        voice = tmp_path / "voice.yaml"
        voice.write_text(yaml.safe_dump(VOICE))
        with fake_speech() as speech_url:
            extra = {"SWITCHBOARD_CONFIG": str(voice), "OPENAI_API_KEY": "sk-count", "OPENAI_BASE_URL": speech_url}
            gw.start({**LIMITS_OFF, **extra, "SWITCHBOARD_MODEL": "offline"})
            one_at_a_time(gw, counts, "voice", 1010, "hello there")
            gw.stop()
        retention = tmp_path / "retention.yaml"
        retention.write_text(MINIMAL_CONFIG + RETENTION)
        sealed = {"SWITCHBOARD_CONFIG": str(retention), "SWITCHBOARD_DATA_KEYS": new_key("k1")}
        gw.start({**LIMITS_OFF, **sealed, "SWITCHBOARD_LOG_LEVEL": "INFO"})
        gw.wait_for_log("retention sweep removed")  # the start-up sweep (over every session so far) is not counted
        one_at_a_time(gw, counts, "retention_sealed", 1101, "hello there")
        gw.start({**LIMITS_OFF, "SWITCHBOARD_EVALS__SAMPLE_RATE": "1"})
        one_at_a_time(gw, counts, "sampled", 1201, "hello there")
        with replica_of(gw.server, tmp_path / "replica"):
            gw.start(
                {**LIMITS_OFF, "SWITCHBOARD_QUEUE__ACK_REPLICAS": "1", "SWITCHBOARD_QUEUE__ACK_TIMEOUT_MS": "2000"}
            )
            one_at_a_time(gw, counts, "ack_replicas", 1301, "hello there")
            gw.stop()
    measured = {scenario: per_message(c) for scenario, c in counts.items()}
    strays = [f"{s}: {r}" for s, row in measured.items() for r in row if r.startswith("other")]
    assert not strays, f"commands from a client that is neither web nor worker: {strays}"
    if measured != PINNED:
        pytest.fail(report(measured), pytrace=False)
