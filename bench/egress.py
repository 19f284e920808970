"""Egress proxy overhead (issue #10): a request through the proxy against the same request sent directly, one run.

An upstream server (aiohttp, 1 KiB answers, HTTP and HTTPS) and the egress proxy each run in their own process (on
uvloop, as workers do, when it is installed), pinned to one core; the
client (this process) sends sequential keep-alive GETs in interleaved batches: direct HTTP, proxied HTTP, direct
HTTPS, proxied HTTPS (CONNECT, TLS terminated with the deployment CA, re-encrypted upstream with verification).
The proxy records every request for real (event log entry + counter in the embedded Redis). Reported per mode:
median and p95 latency, CPU per request of the upstream and of the proxy (psutil, user + system), and the ratios
proxied / direct.

    python -m bench.egress
    python -m bench.egress --quick
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult

from bench._harness import (
    PYTHON,
    SUMMARY_HEADERS,
    Proc,
    Row,
    cores,
    fmt,
    median,
    parser,
    percentile,
    render_table,
    rounds_of,
    start_redis,
    verdicts,
    workdir,
)

NAME = "bench.example.test"
BODY = b"x" * 1024
MODES = ("direct http", "proxied http", "direct https", "proxied https")


class _Resolver(AbstractResolver):
    """The bench's name → loopback (the production resolver would refuse loopback)."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        return [{"hostname": host, "host": "127.0.0.1", "port": port, "family": socket.AF_INET, "proto": 0, "flags": 0}]

    async def close(self) -> None:
        return None


# ---------------------------------------------------------------- children


async def _upstream(root: Path) -> None:
    async def hello(_: web.Request) -> web.Response:
        return web.Response(body=BODY)

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(root / "upstream.pem")
    ports = []
    for ctx in (None, tls):
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ctx)
        await site.start()
        ports.append(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    _publish(root / "upstream.json", ports)
    await asyncio.Event().wait()


async def _proxy(root: Path, redis_url: str) -> None:
    import redis.asyncio as aioredis

    from switchboard.egress.ca import DeploymentCA
    from switchboard.egress.events import RedisEgressSink
    from switchboard.egress.forward import Forwarder
    from switchboard.egress.policy import EgressPolicy
    from switchboard.egress.proxy import EgressProxy
    from switchboard.settings import load_settings

    http_port, https_port = json.loads((root / "upstream.json").read_text())
    (root / "sb.yaml").write_text(f"default_agent: bench\nagents:\n  bench:\n    egress:\n      allow: [{NAME}]\n")
    settings = load_settings(
        {
            "SWITCHBOARD_CONFIG": str(root / "sb.yaml"),
            "SWITCHBOARD_DATA_DIR": str(root / "data"),
            "SWITCHBOARD_EGRESS__PORTS": f"{http_port},{https_port}",
            "SWITCHBOARD_EGRESS__INTERNAL_NETWORKS": "127.0.0.1/32",
            "SWITCHBOARD_EGRESS__UPSTREAM_CA_FILE": str(root / "upstream-ca" / "ca-cert.pem"),
        }
    )
    policy = EgressPolicy.from_settings(settings)
    sink = RedisEgressSink(aioredis.Redis.from_url(redis_url))
    forwarder = Forwarder(policy, settings.egress, sink, resolver=_Resolver())
    ca = DeploymentCA.load_or_create(settings.data_path / "egress" / "ca")
    async with EgressProxy(forwarder, ca) as proxy:
        grant = policy.grant("bench", "default/bench/web/main/bench")
        _publish(root / "proxy.json", {"port": proxy.port, "token": grant.token, "ca": str(ca.cert_path)})
        await asyncio.Event().wait()


# ---------------------------------------------------------------- the client


async def _batch(http: aiohttp.ClientSession, url: str, n: int, **kw: object) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        async with http.get(url, **kw) as resp:  # type: ignore[arg-type]
            body = await resp.read()
        out.append((time.perf_counter() - t0) * 1000)
        if resp.status != 200 or body != BODY:
            raise RuntimeError(f"{url}: {resp.status} {body[:200]!r}")
    return out


def _publish(path: Path, data: object) -> None:
    """Write ``data`` as JSON for the other process, whole or not at all (it polls for the file to appear)."""
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps(data))
    partial.replace(path)


def _wait_file(path: Path, proc: Proc) -> dict[str, object] | list[int]:
    deadline = time.monotonic() + 30
    while not path.exists():
        if proc.popen.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.name} did not start:\n{proc.tail()}")
        time.sleep(0.02)
    data: dict[str, object] | list[int] = json.loads(path.read_text())
    return data


async def measure(root: Path, n: int, rounds: int) -> dict[str, dict[str, float]]:
    """Latencies and CPU per request for every mode."""
    from switchboard.egress.ca import DeploymentCA

    upstream_ca = DeploymentCA.load_or_create(root / "upstream-ca")
    cert, key = upstream_ca.issue(NAME)
    (root / "upstream.pem").write_bytes(cert + key)
    server_cpus, load_cpus = cores()
    redis = start_redis(root, load_cpus)
    upstream = Proc(
        "upstream", [PYTHON, "-m", "bench.egress", "--child", "upstream", str(root)], cpus=server_cpus, log_dir=root
    )
    proxy: Proc | None = None
    try:
        ports = _wait_file(root / "upstream.json", upstream)
        assert isinstance(ports, list)
        proxy = Proc(
            "proxy",
            [PYTHON, "-m", "bench.egress", "--child", "proxy", str(root), redis.url],
            cpus=server_cpus,
            log_dir=root,
        )
        info = _wait_file(root / "proxy.json", proxy)
        assert isinstance(info, dict)
        proxy_url = f"http://{info['token']}:@127.0.0.1:{info['port']}"
        direct_tls = ssl.create_default_context(cafile=str(upstream_ca.cert_path))
        sandbox_tls = ssl.create_default_context(cafile=str(info["ca"]))
        urls = {
            "direct http": (f"http://{NAME}:{ports[0]}/", {}),
            "proxied http": (f"http://{NAME}:{ports[0]}/", {"proxy": proxy_url}),
            "direct https": (f"https://{NAME}:{ports[1]}/", {"ssl": direct_tls}),
            "proxied https": (f"https://{NAME}:{ports[1]}/", {"proxy": proxy_url, "ssl": sandbox_tls}),
        }
        lat: dict[str, list[float]] = {m: [] for m in MODES}
        cpu = {m: {"upstream": 0.0, "proxy": 0.0} for m in MODES}
        connector = aiohttp.TCPConnector(resolver=_Resolver(), use_dns_cache=False)
        async with aiohttp.ClientSession(connector=connector) as http:
            for mode in MODES:  # warm-up: connections, TLS sessions, leaf certificate
                await _batch(http, urls[mode][0], 20, **urls[mode][1])
            for _ in range(rounds):
                for mode in MODES:
                    up0, px0 = upstream.cpu_s(), proxy.cpu_s()
                    lat[mode] += await _batch(http, urls[mode][0], n, **urls[mode][1])
                    cpu[mode]["upstream"] += upstream.cpu_s() - up0
                    cpu[mode]["proxy"] += proxy.cpu_s() - px0
        total = n * rounds
        return {
            mode: {
                "median_ms": median(lat[mode]),
                "p95_ms": percentile(lat[mode], 95),
                "upstream_cpu_us": cpu[mode]["upstream"] / total * 1e6,
                "proxy_cpu_us": cpu[mode]["proxy"] / total * 1e6,
            }
            for mode in MODES
        }
    finally:
        if proxy is not None:
            proxy.stop()
        upstream.stop()
        redis.stop()


async def run(argv: list[str] | None = None) -> list[Row]:
    """Run the benchmark and return its summary rows."""
    ns = parser(__doc__ or "").parse_args(argv)
    n = 100 if ns.quick else 1000
    with workdir("sb-bench-egress-") as root:
        found = await measure(root, n, rounds_of(ns))
    rows = []
    for mode in MODES:
        f = found[mode]
        total = f["upstream_cpu_us"] + f["proxy_cpu_us"]
        rows.append(
            [
                mode,
                fmt(f["median_ms"], 3),
                fmt(f["p95_ms"], 3),
                fmt(f["upstream_cpu_us"], 0),
                fmt(f["proxy_cpu_us"], 0),
                fmt(total, 0),
            ]
        )
    print(
        render_table(
            f"Egress proxy overhead, {n} sequential keep-alive GETs × {rounds_of(ns)} rounds per mode (1 KiB answers)",
            [
                "mode",
                "median (ms)",
                "p95 (ms)",
                "upstream CPU/req (µs)",
                "proxy CPU/req (µs)",
                "server-side CPU/req (µs)",
            ],
            rows,
        )
    )
    summary = []
    for scheme in ("http", "https"):
        d, p = found[f"direct {scheme}"], found[f"proxied {scheme}"]
        lat_ratio = p["median_ms"] / d["median_ms"]
        cpu_ratio = (p["upstream_cpu_us"] + p["proxy_cpu_us"]) / max(d["upstream_cpu_us"], 1e-9)
        print(
            f"{scheme}: proxied/direct median latency ×{lat_ratio:.2f} (+{p['median_ms'] - d['median_ms']:.3f} ms), "
            f"server-side CPU per request ×{cpu_ratio:.2f} (proxy {p['proxy_cpu_us']:.0f} µs)"
        )
        summary.append(
            Row("egress", f"{scheme} added median latency (ms)", fmt(p["median_ms"] - d["median_ms"], 3), "—", None)
        )
        summary.append(Row("egress", f"{scheme} proxy CPU per request (µs)", fmt(p["proxy_cpu_us"], 0), "—", None))
    print()
    return verdicts(summary, ns.quick)


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.egress``."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--child"]:
        role, root = args[1], Path(args[2])
        try:  # as in the worker, which runs on uvloop when it is installed
            import uvloop

            uvloop.run(_upstream(root) if role == "upstream" else _proxy(root, args[3]))
        except ImportError:
            asyncio.run(_upstream(root) if role == "upstream" else _proxy(root, args[3]))
        return 0
    rows = asyncio.run(run(args))
    print(render_table("Egress proxy (issue #10)", SUMMARY_HEADERS, [r.cells() for r in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
