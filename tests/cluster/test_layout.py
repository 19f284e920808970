"""The layout check and ``switchboard migrate`` on a Redis Cluster (the migration itself runs on one server)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import redis

from switchboard.errors import LayoutError
from switchboard.queue.migrations import LAYOUT, check_layout

pytestmark = pytest.mark.cluster


def test_an_empty_cluster_is_stamped_with_the_layout_once(cluster_url: str) -> None:
    client = redis.RedisCluster.from_url(cluster_url)
    try:
        check_layout(client, "worker")
        check_layout(client, "web")
        assert client.get("sb:layout") == str(LAYOUT).encode()
    finally:
        client.close()


def test_layout_one_keys_on_any_primary_refuse_a_start(cluster_url: str) -> None:
    client = redis.RedisCluster.from_url(cluster_url)
    try:
        # a session key of the release before, on whichever primary owns its slot
        client.rpush("sb:{acme/assistant/telegram/bot1/chat-1}:inbox", "m1")
        with pytest.raises(LayoutError, match="switchboard migrate"):
            check_layout(client, "worker")
        assert client.get("sb:layout") is None
    finally:
        client.close()


def test_migrate_refuses_a_cluster_url_and_says_where_to_run_it(cluster_url: str, base_env: dict[str, str]) -> None:
    env = {**base_env, "SWITCHBOARD_REDIS_URL": cluster_url.replace("redis://", "redis+cluster://", 1)}
    done = subprocess.run(
        [sys.executable, "-m", "switchboard", "migrate"], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "single server" in done.stderr and "Traceback" not in done.stderr
