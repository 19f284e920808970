"""Sandboxed commands reach the network only through the worker's egress proxy, end to end.

Everything is real: the worker's :func:`~switchboard.egress.gate.start_sandbox_egress` (the proxy on its unix
socket, the Redis event sink), the ``shell`` tool through the tool gateway (and through a whole turn), bubblewrap
with the bridge, ``curl`` and Python's urllib inside. Destinations are the local HTTP(S) servers of
``tests/egress/conftest.py`` under test names that the proxy's test resolver maps to loopback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import shutil
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import redis.asyncio as aioredis

from switchboard.core.agent.replay import ReplayModel
from switchboard.core.events import EgressRequested, EventAdapter
from switchboard.core.tools.builtin import ToolRegistry, default_registry
from switchboard.core.tools.builtin.shell import PROXIED, ShellOptions, shell_tools
from switchboard.core.tools.definition import ToolContext
from switchboard.core.tools.gateway import ToolGateway
from switchboard.core.turn import TurnRequest
from switchboard.core.workspaces.disk import workspace_for
from switchboard.egress.gate import NO_HOSTS, SandboxEgress, start_sandbox_egress
from switchboard.queue.eventlog import read_events
from switchboard.queue.keys import SessionKeys
from switchboard.sandbox.runner import GRANT_SHOWN_AS, Sandbox
from switchboard.types import SessionKey
from tests.core.turns import MemorySink, MemoryStore, answer_step, calls_step, message, runtime
from tests.egress.conftest import SECRET_VALUE, World
from tests.sandbox.conftest import sandbox_of

SESSION = SessionKey("default/assistant/web/main/conv-1")
PLACEHOLDER = "{{secret:GITHUB_TOKEN}}"


def needs_curl() -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed on this host")


@dataclass
class Wired:
    """The worker's egress proxy, a bubblewrap sandbox and the ``shell`` tool over both."""

    world: World
    gate: SandboxEgress
    box: Sandbox
    workspace: Path

    @property
    def proxy_tcp(self) -> str:
        assert self.gate.proxy is not None
        return f"{self.gate.proxy.host}:{self.gate.proxy.port}"

    def context(self, agent: str = "assistant") -> ToolContext:
        return ToolContext(
            session_key=SESSION,
            tenant="default",
            run_id="run-1",
            actor="u1",
            workspace=self.workspace,
            idempotency_key="",
            agent=agent,
        )

    def gateway(self, box: Sandbox | None = None) -> ToolGateway:
        tools = shell_tools(box or self.box, ShellOptions(progress_after_s=0), self.gate)
        return ToolGateway(ToolRegistry(tools), workspace_root=self.workspace.parent)

    async def shell(self, *commands: str, agent: str = "assistant", box: Sandbox | None = None, **args: Any) -> Any:
        outcome = await self.gateway(box).call("shell", {"commands": list(commands), **args}, self.context(agent))
        assert outcome.ok, outcome.error
        return outcome.value

    def url(self, host: str, path: str = "/", *, tls: bool = False) -> str:
        return self.world.url(host, path, tls=tls)


@pytest.fixture
async def wired(world: World, async_redis: aioredis.Redis, tmp_path: Path) -> AsyncIterator[Wired]:
    box = sandbox_of("bwrap")  # skips, naming why, where bubblewrap does not run
    gate = await start_sandbox_egress(world.settings, async_redis, box, resolver=world.resolver)
    assert gate is not None and gate.proxy is not None
    workspace = tmp_path / "ws" / "session"
    workspace.mkdir(parents=True)
    yield Wired(world, gate, box, workspace)
    await gate.close()


async def _status_with(wired: Wired, proxy_url: str) -> int:
    """What the worker's proxy answers a request sent with ``proxy_url``'s credentials (from the host)."""
    async with aiohttp.ClientSession() as http, http.get(wired.url("api.example.test", "/again"), proxy=proxy_url) as r:
        return r.status


def _stdout(result: Any) -> list[str]:
    return [entry["stdout"] for entry in result["output"]]


async def test_curl_and_urllib_reach_an_allowlisted_host_through_the_proxy(
    wired: Wired, async_redis: aioredis.Redis
) -> None:
    needs_curl()
    url = wired.url("api.example.test", "/py")
    fetch = f"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())"
    result = await wired.shell(f"curl -sS {wired.url('api.example.test', '/curl')}", f'python3 -c "{fetch}"')
    answers = [json.loads(out) for out in _stdout(result)]
    assert [a["path"] for a in answers] == ["/curl", "/py"], result
    assert sorted(hit["path"] for hit in wired.world.public.hits) == ["/curl", "/py"]
    assert result["network"] == PROXIED
    raw: Any = await async_redis.xrange(SessionKeys(SESSION).events)
    facts = [EventAdapter.validate_json(fields[b"data"]) for _, fields in raw]
    assert all(isinstance(fact, EgressRequested) for fact in facts)  # a member of the event union
    assert sorted((f.path, f.decision, f.agent) for f in facts if isinstance(f, EgressRequested)) == [
        ("/curl", "allowed", "assistant"),
        ("/py", "allowed", "assistant"),
    ]


async def test_a_host_outside_the_allowlist_gets_the_proxys_refusal(wired: Wired, async_redis: aioredis.Redis) -> None:
    needs_curl()
    result = await wired.shell(
        f"curl -sS -w ' %{{http_code}}' {wired.url('blocked.test', '/x')}",
        f"curl -sS {wired.url('blocked.test', '/x', tls=True)}",
    )
    plain, tunnel = result["output"]
    assert plain["stdout"] == "egress refused: domain_not_allowed\n 403"
    assert tunnel["outcome"]["exit_code"] != 0 and "403" in tunnel["stderr"]
    assert wired.world.public.hits == [] and wired.world.tls.hits == [] and wired.world.private.hits == []
    events = await read_events(async_redis, SESSION)
    assert [(e["host"], e["reason"]) for e in events] == [("blocked.test", "domain_not_allowed")] * 2


async def test_a_direct_connection_bypassing_the_proxy_fails(wired: Wired) -> None:
    needs_curl()
    port = wired.world.public.port
    proxy_port = wired.proxy_tcp.rpartition(":")[2]
    probe = (
        "import socket\n"
        f"for host, port in [('127.0.0.2', {port}), ('127.0.0.1', {port}), ('127.0.0.1', {proxy_port}), "
        "('10.0.2.2', 80), ('1.1.1.1', 80)]:\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=3); print('CONNECTED', host, port)\n"
        "    except OSError as err:\n"
        "        print('refused', host, port, type(err).__name__)\n"
    )
    (wired.workspace / "probe.py").write_text(probe)
    result = await wired.shell(
        f"curl -sS --noproxy '*' --max-time 5 http://127.0.0.2:{port}/direct",
        f"env -u HTTP_PROXY -u http_proxy curl -sS --max-time 5 {wired.url('api.example.test', '/direct')}",
        f"curl -sS --max-time 5 --proxy http://{wired.proxy_tcp} {wired.url('api.example.test', '/direct')}",
        "python3 probe.py",
    )
    *curls, python = result["output"]
    assert all(entry["outcome"]["exit_code"] != 0 for entry in curls), curls
    assert python["stdout"].count("refused") == 5 and "CONNECTED" not in python["stdout"], python
    assert wired.world.public.hits == [] and wired.world.private.hits == [] and wired.world.tls.hits == []


async def test_https_to_an_allowlisted_host_works_through_the_deployment_ca(wired: Wired) -> None:
    needs_curl()
    url = wired.url("api.example.test", "/tls-py", tls=True)
    fetch = f"import urllib.request; print(urllib.request.urlopen('{url}').read().decode())"
    result = await wired.shell(
        f"curl -sS {wired.url('api.example.test', '/tls-curl', tls=True)}",
        f'python3 -c "{fetch}"',
        "test -r $SSL_CERT_FILE && test ! -w $SSL_CERT_FILE && grep -c 'BEGIN CERTIFICATE' $CURL_CA_BUNDLE",
    )
    curl_out, python_out, ca = _stdout(result)
    assert (json.loads(curl_out)["path"], json.loads(python_out)["path"]) == ("/tls-curl", "/tls-py"), result
    assert ca == "1\n"  # the deployment CA alone, read-only
    assert sorted(hit["path"] for hit in wired.world.tls.hits) == ["/tls-curl", "/tls-py"]


async def test_a_secret_is_substituted_only_for_its_domain_and_never_shown(
    wired: Wired,
    async_redis: aioredis.Redis,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    needs_curl()
    caplog.set_level(logging.DEBUG)
    header = f"-H 'Authorization: Bearer {PLACEHOLDER}'"
    result = await wired.shell(
        f"curl -sS {header} {wired.url('api.example.test', '/echo-auth')}",
        f"curl -sS {header} {wired.url('api.example.test', '/echo-auth', tls=True)}",
        f"curl -sS {header} {wired.url('other.example.test', '/leak')}",
        "env | grep -c -e GH_TOKEN -e ghp_; grep -c ghp_ /proc/self/environ",
    )
    cleartext, bound_tls, unbound, env = _stdout(result)
    assert bound_tls == f"Bearer {PLACEHOLDER}"  # the echo is taken back out
    assert cleartext == "egress refused: placeholder_insecure\n"  # never over plain http, even to its own host
    assert unbound == "egress refused: placeholder_unbound\n"
    assert wired.world.public.hits == []
    seen = [hit["headers"]["Authorization"] for hit in wired.world.tls.hits]
    assert seen == [f"Bearer {SECRET_VALUE}"]  # it did reach the host it is bound to, over TLS, and only there
    assert all(hit["path"] == "/echo-auth" for hit in wired.world.tls.hits)
    assert env == "0\n0\n"  # neither the variable nor its value is in the sandbox
    events = await read_events(async_redis, SESSION)
    assert sorted(e["secrets"] for e in events) == [[], [], ["GITHUB_TOKEN"]]
    out, err = capfd.readouterr()
    for text in (json.dumps(result), repr(events), caplog.text, out, err):
        assert SECRET_VALUE not in text


async def test_the_grant_lives_only_while_the_call_runs(
    wired: Wired, async_redis: aioredis.Redis, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    needs_curl()
    caplog.set_level(logging.DEBUG)
    result = await wired.shell(
        "echo $HTTP_PROXY; printf %s $HTTP_PROXY > proxy.txt",
        f"curl -sS -o /dev/null -w '%{{http_code}}' {wired.url('api.example.test', '/during')}",
    )
    shown, during = _stdout(result)
    assert shown == f"http://{GRANT_SHOWN_AS}:grant@127.0.0.1:3128\n"  # the token never reaches the model
    assert during == "200"
    saved = (wired.workspace / "proxy.txt").read_text()  # what a command could keep for later
    token = saved.removeprefix("http://").partition(":")[0]
    assert token and token not in json.dumps(result)
    assert wired.gate.policy.lookup(token) is None
    assert await _status_with(wired, f"http://{token}:grant@{wired.proxy_tcp}") == 407
    again = await wired.shell(
        f"curl -sS -o /dev/null -w '%{{http_code}}' --proxy \"$(cat proxy.txt)\" {wired.url('api.example.test', '/x')}"
    )
    assert _stdout(again) == ["407"]
    assert [hit["path"] for hit in wired.world.public.hits] == ["/during"]
    out, err = capfd.readouterr()
    for text in (json.dumps(again), repr(await read_events(async_redis, SESSION)), caplog.text, out, err):
        assert token not in text


async def test_the_grant_is_revoked_on_timeout_and_on_cancellation(wired: Wired) -> None:
    timed_out = await wired.shell("printf %s $HTTP_PROXY > timeout.txt; sleep 30", timeout_ms=1500)
    assert timed_out["output"][0]["outcome"] == {"type": "timeout"}
    token = (wired.workspace / "timeout.txt").read_text().removeprefix("http://").partition(":")[0]
    assert token and wired.gate.policy.lookup(token) is None
    assert await _status_with(wired, f"http://{token}:grant@{wired.proxy_tcp}") == 407

    marker = wired.workspace / "cancel.txt"
    call = asyncio.create_task(wired.shell("printf %s $HTTP_PROXY > cancel.tmp; mv cancel.tmp cancel.txt; sleep 30"))
    deadline = time.monotonic() + 30
    while not marker.exists() and time.monotonic() < deadline and not call.done():
        await asyncio.sleep(0.05)
    token = marker.read_text().removeprefix("http://").partition(":")[0]
    assert wired.gate.policy.lookup(token) is not None  # live while the call runs
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert wired.gate.policy.lookup(token) is None
    assert await _status_with(wired, f"http://{token}:grant@{wired.proxy_tcp}") == 407


async def test_an_agent_without_an_allowlist_gets_no_network(wired: Wired) -> None:
    result = await wired.shell("env | grep -ci proxy; curl -sS --max-time 5 http://api.example.test/", agent="other")
    assert result["network"] == NO_HOSTS
    [entry] = result["output"]
    assert entry["stdout"] == "0\n" and entry["outcome"]["exit_code"] != 0
    assert wired.world.public.hits == []


async def test_a_landlock_sandbox_keeps_no_network_and_says_why(wired: Wired) -> None:
    landlock = sandbox_of("landlock")
    result = await wired.shell("env | grep -ci proxy", box=landlock)
    assert result["network"] == "none: a landlock+seccomp sandbox cannot reach the egress proxy"
    assert _stdout(result) == ["0\n"]


async def test_a_whole_turn_keeps_the_token_and_the_secret_out_of_the_models_context(
    wired: Wired, tmp_path: Path
) -> None:
    needs_curl()
    agent = wired.world.settings.file.agents["assistant"].model_copy(update={"tools": ["shell"]})
    rt = runtime(tmp_path, registry=default_registry(sandbox=wired.box, egress=wired.gate))
    fetch = f"curl -sS -H 'Authorization: {PLACEHOLDER}' {wired.url('api.example.test', '/echo-auth', tls=True)}"
    command = f"echo $HTTPS_PROXY; printf %s $HTTPS_PROXY > proxy.txt; {fetch}"
    model = ReplayModel([calls_step(("shell", {"commands": [command]}), step=1), answer_step("done", step=2)])
    rt.models.override("offline", model)
    msg = message("fetch it")
    turn = TurnRequest(session_key=msg.session_key, agent=agent, messages=[msg], run_id="r1", deadline=time.time() + 60)
    sink = MemorySink()
    await rt.run_turn(turn, sink, MemoryStore())
    assert "allowlisted" in next(t.description for t in model.requests[0].tools if t.name == "shell")
    context = model.requests[1].messages[-1].content
    assert f"http://{GRANT_SHOWN_AS}:grant@127.0.0.1:3128" in context and PLACEHOLDER in context, context
    assert SECRET_VALUE not in repr(model.requests) and SECRET_VALUE not in repr(sink.events)
    assert wired.world.tls.hits[0]["headers"]["Authorization"] == SECRET_VALUE  # the turn's agent's own secret
    token = (workspace_for(tmp_path / "ws", msg.session_key) / "proxy.txt").read_text()
    token = token.removeprefix("http://").partition(":")[0]
    assert token and token not in repr(model.requests) and wired.gate.policy.lookup(token) is None


def _command_lines() -> list[bytes]:
    """Every process's command line this user can read (as ``ps -eo args`` shows them to anyone)."""
    found: list[bytes] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                found.append((entry / "cmdline").read_bytes())
            except OSError:
                continue
    return found


async def _raw_status(socket_path: Path, token: str, url: str) -> bytes:
    """The status line the proxy's shared unix socket answers a request presenting ``token``."""
    credentials = base64.b64encode(f"{token}:grant".encode()).decode()
    reader, writer = await asyncio.open_unix_connection(str(socket_path))
    writer.write(f"GET {url} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {credentials}\r\n\r\n".encode())
    await writer.drain()
    line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return line


async def _host_curl(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "10", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode()


async def test_a_live_grant_is_on_no_command_line_and_useless_outside_its_sandbox(wired: Wired) -> None:
    needs_curl()
    echo = wired.url("api.example.test", "/echo-auth", tls=True)
    inside = f"curl -sS -H 'Authorization: Bearer {PLACEHOLDER}' {echo} > inside.txt"
    marker = wired.workspace / "live.txt"
    call = asyncio.create_task(
        wired.shell(f"{inside}; printf %s $HTTPS_PROXY > live.tmp; mv live.tmp live.txt; sleep 30")
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline and not call.done():
            await asyncio.sleep(0.05)
        token = marker.read_text().removeprefix("http://").partition(":")[0]
        assert token and wired.gate.policy.lookup(token) is not None  # live: the call still runs
        assert (wired.workspace / "inside.txt").read_text() == f"Bearer {PLACEHOLDER}"  # the sandbox's own way out
        assert [hit["headers"]["Authorization"] for hit in wired.world.tls.hits] == [f"Bearer {SECRET_VALUE}"]
        assert not [line for line in _command_lines() if token.encode() in line]  # not in bwrap's argv, nor any
        # another local process presenting the live token: refused on the shared TCP port and the shared socket
        assert await _status_with(wired, f"http://{token}:grant@{wired.proxy_tcp}") == 407
        code, out = await _host_curl(
            "--proxy",
            f"http://{token}:grant@{wired.proxy_tcp}",
            "--cacert",
            str(wired.world.proxy.ca.cert_path),
            "-H",
            f"Authorization: Bearer {PLACEHOLDER}",
            echo,
        )
        assert code != 0 and "407" in out and SECRET_VALUE not in out, out
        assert wired.gate.proxy is not None and wired.gate.proxy.socket_path is not None
        status = await _raw_status(wired.gate.proxy.socket_path, token, wired.url("api.example.test", "/outside"))
        assert status.startswith(b"HTTP/1.1 407 ")
        assert len(wired.world.tls.hits) == 1 and wired.world.public.hits == []  # nothing more reached a host
    finally:
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
    assert wired.gate.policy.lookup(token) is None


async def test_a_host_that_stores_or_compresses_the_secret_never_shows_it_to_the_sandbox(
    wired: Wired, async_redis: aioredis.Redis
) -> None:
    needs_curl()
    auth = f"-H 'Authorization: Bearer {PLACEHOLDER}'"
    store, recall = (
        wired.url("api.example.test", "/store", tls=True),
        wired.url("api.example.test", "/recall", tls=True),
    )
    gzipped = wired.url("api.example.test", "/encoded-echo?enc=gzip", tls=True)
    result = await wired.shell(
        f"curl -sS {auth} {store} >/dev/null && curl -sS --compressed -D - {recall}",
        f"curl -sS --compressed {auth} '{gzipped}'",
    )
    recalled, echoed = _stdout(result)
    assert wired.world.tls.stored == f"Bearer {SECRET_VALUE}"  # the host did get (and keep) the real value
    assert f"you stored: Bearer {PLACEHOLDER}" in recalled and f"X-Stored: Bearer {PLACEHOLDER}" in recalled
    assert echoed == f"seen: Bearer {PLACEHOLDER}"
    assert SECRET_VALUE not in json.dumps(result)
    assert SECRET_VALUE not in repr(await read_events(async_redis, SESSION))
