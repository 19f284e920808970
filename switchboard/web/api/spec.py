"""The integration API's OpenAPI 3.1 document (served at ``/api/v1/openapi.json``, copied in docs)."""

from __future__ import annotations

import functools
from typing import Any, Final

from switchboard.settings.api import SCOPES

__all__ = ["PREFIX", "openapi_document"]

PREFIX: Final = "/api/v1"

_ERROR: Final = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}},
        }
    },
}
_TARGET: Final = {
    "channel": {"type": "string", "minLength": 1, "maxLength": 64, "examples": ["telegram"]},
    "account": {"type": "string", "minLength": 1, "maxLength": 200, "default": "default"},
    "conversation": {
        "type": "string",
        "minLength": 1,
        "maxLength": 500,
        "description": "The platform's conversation id (Telegram chat id, Slack channel id, WhatsApp number, …).",
    },
    "thread": {"type": ["string", "null"], "minLength": 1, "maxLength": 500},
}
_ACCEPTED: Final = {
    "type": "object",
    "required": ["message_id", "session"],
    "properties": {"message_id": {"type": "string"}, "session": {"type": "string"}},
}


def _errors(*statuses: int) -> dict[str, Any]:
    reasons = {
        400: "Malformed or refused request",
        401: "No token, or not a valid one",
        403: "The token lacks the scope, or the channel account is another tenant's",
        404: "No such channel account",
        413: "The body is too large",
        422: "The Idempotency-Key was used with another body",
        429: "The conversation's abuse limit refused it for now",
        503: "Redis did not answer in time; retry",
    }
    return {
        str(status): {
            "description": reasons[status],
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
        }
        for status in statuses
    }


def _accepted(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "headers": {
            "Idempotent-Replayed": {
                "description": "`true` when the Idempotency-Key was seen before: nothing new was queued",
                "schema": {"type": "string"},
            }
        },
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Accepted"}}},
    }


def _idempotency(required: bool) -> dict[str, Any]:
    return {
        "name": "Idempotency-Key",
        "in": "header",
        "required": required,
        "description": "The same key (per token and conversation) queues once and answers the same response.",
        "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,200}$"},
    }


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The document (built once; the routes it lists are pinned by a test against the router)."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Switchboard integration API",
            "version": "1.0.0",
            "description": "Send messages, start agent turns from external events and read conversations. "
            "Authenticate with `Authorization: Bearer <token>` (`switchboard api-tokens create`).",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": {
            f"{PREFIX}/openapi.json": {
                "get": {
                    "operationId": "getOpenApi",
                    "summary": "This document",
                    "security": [],
                    "responses": {"200": {"description": "The OpenAPI document", "content": {"application/json": {}}}},
                }
            },
            f"{PREFIX}/messages": {
                "post": {
                    "operationId": "sendMessage",
                    "summary": "Send a message to a conversation (scope messages:send)",
                    "description": "Queued into the conversation's session like an operator's message, and sent by "
                    "the worker through the outbox and the channel's limits.",
                    "parameters": [_idempotency(False)],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/SendMessage"}}},
                    },
                    "responses": {
                        "202": _accepted("Queued for sending"),
                        **_errors(400, 401, 403, 404, 413, 422, 429, 503),
                    },
                }
            },
            f"{PREFIX}/turns": {
                "post": {
                    "operationId": "startTurn",
                    "summary": "Start an agent turn from an external event (scope turns:start)",
                    "description": "The event reaches the session as an inbound message of kind `external`; the "
                    "agent reads `data` as untrusted data, never as instructions.",
                    "parameters": [_idempotency(True)],
                    "requestBody": {
                        "required": True,
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/StartTurn"}}},
                    },
                    "responses": {
                        "202": _accepted("Queued for the agent"),
                        **_errors(400, 401, 403, 404, 413, 422, 429, 503),
                    },
                }
            },
            f"{PREFIX}/conversations/{{channel}}/{{account}}/{{conversation}}": {
                "get": {
                    "operationId": "readConversation",
                    "summary": "A conversation's state, pending approvals and recent history (scope "
                    "conversations:read; history needs conversations:history)",
                    "parameters": [
                        *(
                            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
                            for name in ("channel", "account", "conversation")
                        ),
                        {"name": "thread", "in": "query", "required": False, "schema": {"type": "string"}},
                    ],
                    "responses": {
                        "200": {
                            "description": "The conversation (``exists: false`` when it has no session yet)",
                            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Conversation"}}},
                        },
                        **_errors(400, 401, 403, 404, 503),
                    },
                }
            },
        },
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": f"A token from `switchboard api-tokens create`; scopes: {', '.join(SCOPES)}.",
                }
            },
            "schemas": {
                "Error": _ERROR,
                "Accepted": _ACCEPTED,
                "SendMessage": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["channel", "conversation", "text"],
                    "properties": {**_TARGET, "text": {"type": "string", "minLength": 1, "maxLength": 4000}},
                },
                "StartTurn": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["channel", "conversation", "event"],
                    "properties": {
                        **_TARGET,
                        "event": {"type": "string", "minLength": 1, "maxLength": 120, "examples": ["order.shipped"]},
                        "data": {"description": "Any JSON: the event's details, shown to the agent as data"},
                    },
                },
                "Conversation": {
                    "type": "object",
                    "required": ["session", "exists", "state", "approvals"],
                    "properties": {
                        "session": {"type": "string"},
                        "exists": {"type": "boolean"},
                        "state": {
                            "type": ["string", "null"],
                            "enum": [
                                "reasoning",
                                "waiting_for_data",
                                "waiting_for_approval",
                                "retrying",
                                "queued",
                                "done",
                                "taken_over",
                                None,
                            ],
                        },
                        "last_activity": {"type": "number"},
                        "inbox_depth": {"type": "integer"},
                        "controlled_by": {"type": ["string", "null"]},
                        "approvals": {"type": "array", "items": {"type": "object"}},
                        "history": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "role": {"type": "string", "enum": ["user", "assistant"]},
                                    "text": {"type": "string"},
                                    "at": {"type": "number"},
                                },
                            },
                        },
                    },
                },
            },
        },
    }


if __name__ == "__main__":  # regenerate the copy in docs: python -m switchboard.web.api.spec > docs/api/openapi.json
    import json

    print(json.dumps(openapi_document(), indent=2, ensure_ascii=False))
