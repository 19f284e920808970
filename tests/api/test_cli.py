"""``switchboard api-tokens create`` and ``switchboard webhooks dead-letters``, as an operator runs them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import redis.asyncio as aioredis
import yaml

from switchboard.outbound.webhooks import WebhookDispatcher
from switchboard.settings import load_settings
from switchboard.web.api.tokens import find_token
from tests.api.test_webhooks import ENV, FAST, endpoint, ingest, passes
from tests.test_cli import sb


def test_a_created_token_is_printed_once_and_only_its_hash_goes_in_the_yaml(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    done = sb("api-tokens", "create", "--name", "crm", "--scopes", "messages:send,turns:start", env=base_env)

    assert done.returncode == 0, done.stderr
    token = done.stdout.strip()
    assert re.fullmatch(r"sb_[A-Za-z0-9_-]{43}", token)
    snippet = done.stderr.split("restart:\n\n", 1)[1]
    assert token not in done.stderr
    config = tmp_path / "with-token.yaml"
    config.write_text(Path(base_env["SWITCHBOARD_CONFIG"]).read_text() + snippet)
    settings = load_settings(base_env | {"SWITCHBOARD_CONFIG": str(config)})
    [entry] = settings.file.api.tokens
    assert find_token(settings.file.api.tokens, token) == entry
    assert (entry.name, entry.tenant, entry.scopes) == ("crm", "default", ("messages:send", "turns:start"))
    assert yaml.safe_load(snippet)["api"]["tokens"][0]["sha256"] == entry.sha256


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--name", "crm", "--scopes", "messages:sendx"], "unknown scope messages:sendx"),
        (["--name", "crm", "--scopes", ","], "unknown scope (none)"),
        (["--name", "bad name", "--scopes", "turns:start"], "must be 1-64 letters"),
    ],
)
def test_a_bad_token_request_prints_no_token(base_env: dict[str, str], args: list[str], error: str) -> None:
    done = sb("api-tokens", "create", *args, env=base_env)

    assert done.returncode == 2 and error in done.stderr and "sb_" not in done.stdout


async def test_dead_lettered_deliveries_are_listed(base_env: dict[str, str], async_redis: aioredis.Redis) -> None:
    hooks = WebhookDispatcher(async_redis, [endpoint("http://10.9.9.9/hooks", allow=())], FAST, ENV, owner="t")
    await hooks.run_once()
    await ingest(async_redis, "hello")
    await passes(hooks, 2)
    await hooks.close()

    done = sb("webhooks", "dead-letters", env=base_env)

    assert done.returncode == 0, done.stderr
    [line] = done.stdout.splitlines()
    assert "message_received" in line and "http://10.9.9.9/hooks" in line and "address_refused:private" in line
