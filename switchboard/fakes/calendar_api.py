"""A fake Google Calendar API v3: events list/get/insert/delete and the free/busy query, in their wire shapes.

State is one dict of calendars (by id) holding events; every request is recorded in :attr:`CalendarApi.hits`. A
request without ``Authorization: Bearer <token>`` gets Google's 401 error body.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from switchboard.fakes import localhost_tls

__all__ = ["CalendarApi"]


def _instant(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _error(status: int, message: str, reason: str) -> web.Response:
    body = {"error": {"code": status, "message": message, "errors": [{"domain": "global", "reason": reason}]}}
    return web.json_response(body, status=status)


@dataclass
class CalendarApi:
    """The fake API under ``/calendar/v3``; ``calendars`` maps a calendar id to its events by id."""

    token: str
    calendars: dict[str, dict[str, dict[str, Any]]] = field(default_factory=lambda: {"primary": {}})
    hits: list[dict[str, Any]] = field(default_factory=list)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def add_event(self, calendar: str, summary: str, start: str, end: str, **extra: Any) -> dict[str, Any]:
        """Put an event in ``calendar`` (as if made elsewhere) and return it."""
        event_id = f"evt{next(self._ids):04d}"
        event = {
            "kind": "calendar#event",
            "id": event_id,
            "status": "confirmed",
            "htmlLink": f"https://calendar.example/event?eid={event_id}",
            "summary": summary,
            "start": {"dateTime": start},
            "end": {"dateTime": end},
            **extra,
        }
        self.calendars.setdefault(calendar, {})[event_id] = event
        return event

    def live(self, calendar: str) -> list[dict[str, Any]]:
        """The calendar's events that are not cancelled, soonest first."""
        events = [e for e in self.calendars.get(calendar, {}).values() if e["status"] != "cancelled"]
        return sorted(events, key=lambda e: _instant(e["start"]["dateTime"]))

    def app(self) -> web.Application:
        """The aiohttp application."""

        @web.middleware
        async def record_and_authorise(request: web.Request, handler: Any) -> web.StreamResponse:
            body = await request.read()
            self.hits.append(
                {"method": request.method, "path": request.path_qs, "headers": request.headers.copy(), "body": body}
            )
            if request.headers.get("Authorization") != f"Bearer {self.token}":
                return _error(401, "Request had invalid authentication credentials.", "authError")
            response: web.StreamResponse = await handler(request)
            return response

        def calendar(request: web.Request) -> dict[str, dict[str, Any]]:
            found = self.calendars.get(request.match_info["cal"])
            if found is None:
                raise web.HTTPNotFound(text='{"error": {"code": 404, "message": "Not Found"}}')
            return found

        async def list_events(request: web.Request) -> web.Response:
            calendar(request)
            try:
                low = _instant(request.query["timeMin"]) if "timeMin" in request.query else None
                high = _instant(request.query["timeMax"]) if "timeMax" in request.query else None
            except ValueError:
                return _error(400, "Bad Request", "badRequest")
            text = request.query.get("q", "").casefold()
            items = []
            for event in self.live(request.match_info["cal"]):
                start, end = _instant(event["start"]["dateTime"]), _instant(event["end"]["dateTime"])
                if (low is not None and end <= low) or (high is not None and start >= high):
                    continue
                words = " ".join(str(event.get(k, "")) for k in ("summary", "description", "location")).casefold()
                if text and text not in words:
                    continue
                items.append(event)
            items = items[: int(request.query.get("maxResults", "250"))]
            return web.json_response(
                {"kind": "calendar#events", "summary": request.match_info["cal"], "timeZone": "UTC", "items": items}
            )

        async def get_event(request: web.Request) -> web.Response:
            event = calendar(request).get(request.match_info["eid"])
            if event is None:
                return _error(404, "Not Found", "notFound")
            return web.json_response(event)

        async def insert_event(request: web.Request) -> web.Response:
            events = calendar(request)
            body = await request.json()
            if not isinstance(body, dict) or "start" not in body or "end" not in body:
                return _error(400, "Missing end time.", "required")
            try:
                if _instant(body["end"]["dateTime"]) <= _instant(body["start"]["dateTime"]):
                    return _error(400, "The specified time range is empty.", "timeRangeEmpty")
            except (KeyError, TypeError, ValueError):
                return _error(400, "Bad Request", "badRequest")
            event = self.add_event(
                request.match_info["cal"], body.get("summary", ""), body["start"]["dateTime"], body["end"]["dateTime"]
            )
            event.update({k: v for k, v in body.items() if k in ("description", "location", "attendees")})
            event["start"], event["end"] = body["start"], body["end"]
            events[event["id"]] = event
            return web.json_response(event)

        async def delete_event(request: web.Request) -> web.Response:
            event = calendar(request).get(request.match_info["eid"])
            if event is None or event["status"] == "cancelled":
                return _error(410 if event else 404, "Resource has been deleted" if event else "Not Found", "deleted")
            event["status"] = "cancelled"
            return web.Response(status=204)

        async def free_busy(request: web.Request) -> web.Response:
            body = await request.json()
            try:
                low, high = _instant(body["timeMin"]), _instant(body["timeMax"])
            except (KeyError, TypeError, ValueError):
                return _error(400, "Bad Request", "badRequest")
            calendars: dict[str, Any] = {}
            for item in body.get("items", []):
                if item["id"] not in self.calendars:
                    calendars[item["id"]] = {"errors": [{"domain": "global", "reason": "notFound"}], "busy": []}
                    continue
                busy = [
                    {"start": e["start"]["dateTime"], "end": e["end"]["dateTime"]}
                    for e in self.live(item["id"])
                    if e.get("transparency") != "transparent"
                    and _instant(e["end"]["dateTime"]) > low
                    and _instant(e["start"]["dateTime"]) < high
                ]
                calendars[item["id"]] = {"busy": busy}
            return web.json_response(
                {
                    "kind": "calendar#freeBusy",
                    "timeMin": body["timeMin"],
                    "timeMax": body["timeMax"],
                    "calendars": calendars,
                }
            )

        app = web.Application(middlewares=[record_and_authorise])
        app.router.add_get("/calendar/v3/calendars/{cal}/events", list_events)
        app.router.add_post("/calendar/v3/calendars/{cal}/events", insert_event)
        app.router.add_get("/calendar/v3/calendars/{cal}/events/{eid}", get_event)
        app.router.add_delete("/calendar/v3/calendars/{cal}/events/{eid}", delete_event)
        app.router.add_post("/calendar/v3/freeBusy", free_busy)
        return app


def main(argv: list[str] | None = None) -> None:
    """``python -m switchboard.fakes.calendar_api [--port 8765] [--token dev-token]``: serve with two sample events."""
    import argparse
    from datetime import UTC, timedelta

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--token", default="dev-token")
    parser.add_argument("--tls-dir", type=Path, help="serve HTTPS for localhost under a CA kept in this folder")
    args = parser.parse_args(argv)
    api = CalendarApi(token=args.token)
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) + timedelta(days=1)

    def at(hour: int, minute: int = 0) -> str:
        return (day + timedelta(hours=hour, minutes=minute)).strftime("%Y-%m-%dT%H:%M:%SZ")

    api.add_event("primary", "Standup", at(9), at(9, 15))
    api.add_event("primary", "Dentist", at(14), at(15), location="Main St 4")
    tls = localhost_tls(args.tls_dir) if args.tls_dir else None
    scheme = "https://localhost" if tls else "http://127.0.0.1"
    print(f"fake Google Calendar API on {scheme}:{args.port}/calendar/v3 (token {args.token!r})")
    web.run_app(api.app(), host="127.0.0.1", port=args.port, ssl_context=tls, print=None)


if __name__ == "__main__":
    main()
