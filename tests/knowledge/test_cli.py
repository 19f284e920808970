"""``switchboard knowledge index|list`` as an operator runs them, and the worker's indexing at start and on change."""

from __future__ import annotations

import asyncio
import http.server
import os
import threading
from pathlib import Path

import pytest
import redis

from switchboard.cli import main as cli
from switchboard.cli.knowledge import keep_knowledge_indexed
from switchboard.cli.worker import build_runtime, provider_config
from switchboard.control.memory import memory_store
from switchboard.core.memory.store import SQLiteMemoryStore
from switchboard.core.providers import ModelFactory
from switchboard.queue.keys import SessionKeys
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from tests.core.test_documents import write_pdf
from tests.egress.conftest import PUBLIC

YAML = """
default_agent: helper
agents:
  helper:
    name: helper
    tools: [current_time]
    knowledge: [{path: docs}, {path: faq.md}]
  plain:
    name: plain
"""


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "config"
    (root / "docs").mkdir(parents=True)
    (root / "switchboard.yaml").write_text(YAML)
    (root / "faq.md").write_text("# FAQ\n\nThe office opens at nine. Parking is free for visitors.\n")
    write_pdf(root / "docs" / "policy.pdf", ["Expenses are approved by the team lead within a week"])
    for name in list(os.environ):
        if name.startswith("SWITCHBOARD_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(root / "switchboard.yaml"))
    monkeypatch.setenv("SWITCHBOARD_DATA_DIR", str(tmp_path / "data"))
    return root


def test_index_then_list_then_index_again_only_reads_what_changed(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["knowledge", "index"]) == 0
    out = capsys.readouterr().out
    assert "agent helper (tenant default, project knowledge.helper):" in out
    assert "added" in out and "docs/policy.pdf" in out and "faq.md" in out and "2 added" in out

    assert cli.main(["knowledge", "list", "--agent", "helper"]) == 0
    listed = capsys.readouterr().out
    assert "agent helper (tenant default): 2 source(s) indexed" in listed
    assert "summary:  FAQ The office opens at nine. Parking is free for visitors." in listed
    assert "keywords: " in listed and "expenses" in listed and "chars  indexed 20" in listed

    (config / "faq.md").write_text("# FAQ\n\nThe office now opens at eight.\n")
    (config / "docs" / "broken.pdf").write_text("not a pdf")
    assert cli.main(["knowledge", "index", "--agent", "helper"]) == 1  # one source failed
    again = capsys.readouterr().out
    assert "1 changed" in again and "1 unchanged" in again and "1 failed" in again
    assert "docs/broken.pdf: docs/broken.pdf" in again


def test_unknown_agents_and_agents_without_knowledge_are_named(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["knowledge", "index", "--agent", "ghost"]) == 2
    assert "no agent 'ghost'" in capsys.readouterr().err
    assert cli.main(["knowledge", "list", "--agent", "plain"]) == 2
    assert "agent 'plain' has no knowledge: add `knowledge:`" in capsys.readouterr().err
    (config / "switchboard.yaml").write_text("default_agent: plain\nagents:\n  plain:\n    name: plain\n")
    assert cli.main(["knowledge", "list"]) == 0
    assert "no agent has knowledge" in capsys.readouterr().out
    (config / "switchboard.yaml").write_text(YAML.replace("{path: faq.md}", "{path: ../faq.md}"))
    assert cli.main(["knowledge", "list"]) == 2
    assert "leaves the configuration file's folder" in capsys.readouterr().err


async def test_the_worker_indexes_at_start_re_checks_and_its_agents_get_the_tools(config: Path) -> None:
    settings = load_settings()
    store = memory_store(settings)
    models = ModelFactory(provider_config(settings))
    runtime = build_runtime(settings, models, memory=store)
    helper = settings.file.agents["helper"]
    assert {"search_knowledge", "read_source"} <= {t.name for t in runtime.registry.for_agent(helper)}
    assert not {"search_knowledge", "read_source"} & {
        t.name for t in runtime.registry.for_agent(settings.file.agents["plain"])
    }
    stop = asyncio.Event()
    task = asyncio.create_task(keep_knowledge_indexed(settings, store, models, None, stop, every_s=0.05))
    facts = []
    for _ in range(200):
        facts = await store.facts("default", ["knowledge.helper"])
        if len(facts) == 2:
            break
        await asyncio.sleep(0.05)
    assert len(facts) == 2
    (config / "docs" / "new.md").write_text("A new onboarding checklist for interns.\n")  # found on the next round
    for _ in range(200):
        facts = await store.facts("default", ["knowledge.helper"])
        if len(facts) == 3:
            break
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.wait_for(task, 5)
    assert any(fact.source.ref == "docs/new.md" for fact in facts)
    await models.aclose()
    assert isinstance(store, SQLiteMemoryStore)
    store.close()


def test_agents_validate_names_missing_paths_and_hosts_outside_the_allowlist(
    config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (config / "switchboard.yaml").write_text(
        YAML.replace("{path: faq.md}", "{path: gone.md}, {url: https://wiki.example.com/faq}")
    )
    assert cli.main(["agents", "validate"]) != 0
    captured = capsys.readouterr()
    said = captured.out + captured.err
    assert "knowledge source gone.md: no such file or folder" in said
    assert "wiki.example.com, which is not in its egress allowlist: add it to agents.helper.egress.allow" in said


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html><body><p>Returns are accepted for thirty days.</p></body></html>"
        self.send_response(200 if self.path == "/returns" else 404)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return None


def test_index_fetches_urls_through_egress_and_records_them_in_redis(
    config: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    server = http.server.ThreadingHTTPServer((PUBLIC, 0), _Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        (config / "switchboard.yaml").write_text(
            "default_agent: helper\nagents:\n  helper:\n    name: helper\n"
            f"    knowledge: [{{path: docs}}, {{url: 'http://{PUBLIC}:{port}/returns'}}]\n"
            f"    egress: {{allow: ['{PUBLIC}']}}\n"
        )
        monkeypatch.setenv("SWITCHBOARD_REDIS_URL", redis_url)
        monkeypatch.setenv("SWITCHBOARD_EGRESS__PORTS", f"80,443,{port}")
        monkeypatch.setenv("SWITCHBOARD_EGRESS__INTERNAL_NETWORKS", f"{PUBLIC}/32")
        assert cli.main(["knowledge", "index", "--agent", "helper"]) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        client = redis.Redis.from_url(redis_url)
        try:  # the fetch is an egress fact of the indexing session, like any tool's request
            entries = client.xrange(SessionKeys(SessionKey("default/knowledge/helper")).events)
        finally:
            client.close()
        [entry] = [fields for _, fields in entries if fields[b"kind"] == b"egress_request"]
        assert b"/returns" in entry[b"data"] and b'"agent":"helper"' in entry[b"data"]
        assert "added" in out and f"http://{PUBLIC}:{port}/returns" in out and "2 added" in out
    finally:
        server.shutdown()
        server.server_close()
