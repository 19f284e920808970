"""Channel-agnostic domain (②) and agent runtime (④). Imports no aiohttp, rq, redis or channels."""
