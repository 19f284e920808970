"""``web_search`` against fake Brave, Tavily and SearXNG APIs over real HTTPS, through egress."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError

from switchboard.core.agent.config import Agent
from switchboard.core.agent.runtime import Runtime
from switchboard.core.agent.worklog import tool_message, untrusted_output
from switchboard.core.model import ToolCall
from switchboard.core.providers import ModelFactory, ProviderConfig
from switchboard.core.tools.builtin import default_registry
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.egress import SecretBinding
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.tools.web.config import WebSearch
from switchboard.core.tools.web.search import MAX_SNIPPET_CHARS
from switchboard.egress.forward import Forwarder
from switchboard.egress.policy import EgressPolicy
from switchboard.egress.transport import EgressTransport, search_problems
from switchboard.settings import load_settings
from switchboard.types import SessionKey
from tests.core.turns import MemorySink, MemoryStore, request
from tests.egress.conftest import PUBLIC, ListSink, _serve
from tests.fakes.search_api import BRAVE_KEY, TAVILY_KEY, FakeSearch, Page
from tests.webtools.conftest import SearchWorld

EXPECTED = [
    {
        "title": "Switchboard docs",
        "url": "https://docs.example.org/switchboard",
        "snippet": "A self-hosted gateway.",
        "date": "2026-11-02T00:00:00",
    },
    {"title": "Switchboard on GitHub", "url": "https://github.example/switchboard", "snippet": "Source and issues.",
     "date": None},
]  # fmt: skip


@pytest.mark.parametrize("agent", ["brave", "tavily", "searxng"])
async def test_each_provider_answers_title_url_snippet_and_date_through_egress(
    search_world: Callable[..., SearchWorld], agent: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    world = search_world()
    out = await world.gateway.call("web_search", {"query": "switchboard gateway"}, world.ctx(agent))
    assert out.ok, out.error
    assert out.value["provider"] == agent and out.value["query"] == "switchboard gateway"
    expected = [dict(row) for row in EXPECTED]
    if agent == "tavily":  # Tavily gives the date as it has it
        expected[0]["date"] = "2026-11-02"
    assert out.value["results"] == expected
    (hit,) = world.api.hits
    (event,) = world.sink.events
    assert event.decision == "allowed"
    if agent == "brave":
        assert hit["method"] == "GET" and hit["path"].startswith("/res/v1/web/search?q=switchboard+gateway&count=3")
        assert hit["headers"]["X-Subscription-Token"] == BRAVE_KEY and event.secrets == ("BRAVE_KEY",)
    elif agent == "tavily":
        assert hit["method"] == "POST" and json.loads(hit["body"])["query"] == "switchboard gateway"
        assert hit["headers"]["Authorization"] == f"Bearer {TAVILY_KEY}" and event.secrets == ("TAVILY_KEY",)
    else:
        assert hit["path"] == "/search?q=switchboard+gateway&format=json" and "Authorization" not in hit["headers"]
    for where in (out.model_dump_json(), repr(world.sink.events), caplog.text):
        assert BRAVE_KEY not in where and TAVILY_KEY not in where


async def test_results_are_untrusted_data_shown_in_an_envelope(search_world: Callable[..., SearchWorld]) -> None:
    world = search_world()
    tool = world.registry.get("web_search")
    assert tool is not None and (tool.output_trust, tool.side_effect, tool.cost) == ("data", "read", 1)
    call = ToolCall(id="c1", name="web_search", arguments={"query": "x"})
    out = await world.gateway.call("web_search", call.arguments, world.ctx("searxng"))
    shown = tool_message(call, out.for_model(), untrusted=untrusted_output(tool))  # as the runtime shows it
    assert shown.trust == "data" and shown.content.startswith('<data source="web_search')
    assert 'trust="untrusted"' in shown.content and "https://docs.example.org/switchboard" in shown.content


async def test_results_are_capped_in_number_and_length_and_unusable_urls_are_dropped(
    search_world: Callable[..., SearchWorld],
) -> None:
    world = search_world()
    world.api.pages = [
        Page("javascript", "javascript:alert(1)", "not a page"),
        *(Page(f"T{n} " + "t" * 400, f"https://e.example/{n}", "s" * 5000, "2026-01-01") for n in range(12)),
    ]
    brave = await world.gateway.call("web_search", {"query": "x", "max_results": 10}, world.ctx("brave"))
    assert brave.ok, brave.error
    assert "count=3" in world.api.hits[0]["path"]  # the agent's max_results, whatever the model asks
    assert [row["url"] for row in brave.value["results"]] == ["https://e.example/0", "https://e.example/1"]
    searx = await world.gateway.call("web_search", {"query": "x", "max_results": 10}, world.ctx("searxng"))
    assert searx.tier == "inline"  # bounded by its caps: never a data card
    results = searx.value["results"]
    assert len(results) == 5  # SearXNG answers a page of results: cut to the default cap
    assert all(row["url"].startswith("https://e.example/") for row in results)
    assert all(len(row["snippet"]) <= MAX_SNIPPET_CHARS and len(row["title"]) <= 200 for row in results)
    assert results[0]["snippet"].endswith("…")
    fewer = await world.gateway.call("web_search", {"query": "x", "max_results": 2}, world.ctx("searxng"))
    assert len(fewer.value["results"]) == 2  # the model may ask for fewer


async def test_an_agent_whose_egress_does_not_allow_the_host_is_refused_and_nothing_is_sent(
    search_world: Callable[..., SearchWorld],
) -> None:
    world = search_world()
    out = await world.gateway.call("web_search", {"query": "x"}, world.ctx("closed"))
    assert not out.ok and "egress policy (domain_not_allowed)" in (out.error or "")
    assert world.api.hits == []


async def test_a_hosted_agent_whose_model_has_no_hosted_search_is_told_how_to_configure_one(
    search_world: Callable[..., SearchWorld],
) -> None:
    world = search_world()
    out = await world.gateway.call("web_search", {"query": "x"}, world.ctx("hosted"))
    assert not out.ok and "agents.hosted.search.provider to brave, tavily or searxng" in (out.error or "")
    assert world.api.hits == []


@pytest.mark.parametrize(("status", "error_class"), [(401, "auth"), (429, "rate_limit"), (503, "transient")])
async def test_api_failures_are_classified_without_quoting_the_upstream(
    search_world: Callable[..., SearchWorld], status: int, error_class: str
) -> None:
    world = search_world()
    world.api.status = status
    out = await world.gateway.call("web_search", {"query": "x"}, world.ctx("tavily"))
    assert (out.ok, out.error_class) == (False, error_class)
    assert f"HTTP {status}" in (out.error or "") and "detail" not in (out.error or "")


@pytest.mark.parametrize(
    ("block", "expected"),
    [
        ({"provider": "brave"}, "needs api_key_secret"),
        ({"provider": "searxng"}, "needs url"),
        ({"provider": "searxng", "url": "ftp://x"}, "must be an http(s) URL"),
        ({"provider": "bing", "api_key_secret": "K"}, "Input should be 'hosted', 'brave', 'tavily' or 'searxng'"),
        ({"provider": "brave", "api_key_secret": "K", "max_results": 50}, "less than or equal to 10"),
    ],
)
def test_a_bad_search_block_is_a_clear_error(block: dict[str, object], expected: str) -> None:
    with pytest.raises(ValidationError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        WebSearch.model_validate(block)


def test_the_api_key_secret_must_be_one_of_the_agents_egress_secrets() -> None:
    search = {"provider": "brave", "api_key_secret": "brave_key"}
    with pytest.raises(ValidationError, match=r"is not one of its egress secrets: add egress\.secrets\.BRAVE_KEY"):
        Agent.model_validate({"name": "a", "tools": ["web_search"], "search": search})
    secrets = {"BRAVE_KEY": {"env": "E", "domains": ["api.search.brave.com"]}}
    agent = Agent.model_validate({"name": "a", "search": search, "egress": {"allow": [], "secrets": secrets}})
    assert agent.search.endpoint == "https://api.search.brave.com/res/v1/web/search"


async def test_the_offline_model_searches_with_the_tool_command_as_the_docs_show(
    search_world: Callable[..., SearchWorld],
) -> None:
    world = search_world()
    rt = Runtime(
        models=ModelFactory(ProviderConfig()),
        tools=world.registry,
        workspace_root=world.gateway.workspace_root,
        gateway=world.gateway,
        model_backoff_s=0.0,
    )
    agent = world.settings.file.agents["searxng"]
    sink = MemorySink()
    result = await rt.run_turn(request('/tool web_search {"query": "switchboard"}', agent_=agent), sink, MemoryStore())
    assert [(e.tool, e.ok) for e in sink.of("tool_called")] == [("web_search", True)]
    assert "https://docs.example.org/switchboard" in result.text


async def test_a_searxng_instance_on_a_local_address_over_plain_http_as_the_docs_configure_it(
    tmp_path: Path,
) -> None:
    api = FakeSearch()
    runner, port = await _serve(api.app(), PUBLIC, 0)
    config = tmp_path / "switchboard.yaml"
    config.write_text(
        "agents:\n  researcher:\n    profile: {name: R, description: test}\n    instructions: test\n"
        f"    tools: [web_search]\n    search: {{provider: searxng, url: 'http://{PUBLIC}:{port}/search'}}\n"
        f"    egress: {{allow: ['{PUBLIC}']}}\ndefault_agent: researcher\n"
    )
    settings = load_settings(
        {
            "SWITCHBOARD_CONFIG": str(config),
            "SWITCHBOARD_DATA_DIR": str(tmp_path / "data"),
            "SWITCHBOARD_EGRESS__PORTS": f"80,443,{port}",
            "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": f"{PUBLIC}/32",
        }
    )
    forwarder = Forwarder(EgressPolicy.from_settings(settings), settings.egress, ListSink())
    registry = default_registry(sandbox=None, agents=settings.file.agents, search=EgressTransport(forwarder))
    gateway = ToolGateway(registry, workspace_root=tmp_path / "ws")
    ctx = ToolContext(
        session_key=SessionKey("default/researcher/web/main/c1"), tenant="default", run_id="r", actor="web:u",
        workspace=tmp_path / "ws" / "w", idempotency_key="", agent="researcher",
    )  # fmt: skip
    try:
        out = await gateway.call("web_search", {"query": "switchboard gateway"}, ctx)
    finally:
        await forwarder.close()
        await runner.cleanup()
    assert out.ok, out.error
    assert [row["url"] for row in out.value["results"]] == [page.url for page in api.pages]


async def test_check_reports_a_search_that_cannot_work_as_configured(search_world: Callable[..., SearchWorld]) -> None:
    world = search_world()
    problems = search_problems(world.settings)
    assert problems == [
        "agent 'closed': web_search calls searx.test (searxng), which is not in its egress allowlist: add it to "
        "agents.closed.egress.allow",
        "agent 'hosted': web_search has no hosted search on its model (OpenAI's Responses API and Anthropic have "
        "one): set agents.hosted.search.provider to brave, tavily or searxng",
    ]
    assert search_problems(world.settings, "brave") == []
    unbound = world.settings.file.agents["brave"].egress.model_copy(
        update={"secrets": {"BRAVE_KEY": SecretBinding(env="E", domains=("elsewhere.example",))}}
    )
    world.settings.file.agents["brave"] = world.settings.file.agents["brave"].model_copy(update={"egress": unbound})
    assert search_problems(world.settings, "brave") == [
        "agent 'brave': the search key secret BRAVE_KEY is not bound to api.search.brave.com: add it to "
        "agents.brave.egress.secrets.BRAVE_KEY.domains"
    ]
    for model in ("openai:gpt-4.1-mini", "anthropic:claude-sonnet-4-5"):
        hosted = world.settings.file.agents["hosted"].model_copy(update={"model": model})
        world.settings.file.agents["hosted"] = hosted
        assert search_problems(world.settings, "hosted") == []
