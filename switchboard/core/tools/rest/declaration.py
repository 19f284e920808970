"""A REST tool as an operator declares it in the YAML file (``rest_tools:``), checked when the file loads.

One declaration is one narrow operation (``search_orders``, ``draft_refund``): a method, a URL template whose host is
fixed, a JSON Schema for its arguments, headers that may carry ``{{secret:NAME}}`` placeholders (filled in by egress,
never seen by the model), and the classes the gateway decides it by. There is no generic HTTP tool.
"""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchboard.core.tools.egress import normalize_pattern

__all__ = ["HttpMethod", "RestResult", "RestToolSpec", "path_names"]

HttpMethod = Literal["GET", "POST", "PUT", "PATCH", "DELETE"]
_PATH_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]{0,63})\}")
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_SECRET_ONLY = re.compile(r"\{\{\s*secret:[A-Za-z0-9_]{1,64}\s*\}\}")
_POINTER = re.compile(r"^(/([^~/]|~[01])*)*$")


def path_names(url: str) -> list[str]:
    """The argument names a URL template fills in (``{order_id}``), in order."""
    return _PATH_PARAM.findall(url)


def _pointer(value: str) -> str:
    if not _POINTER.match(value):
        raise ValueError(f"{value!r} is not a JSON pointer (RFC 6901: '' or '/items/0/name')")
    return value


class RestResult(BaseModel):
    """What of a response the model sees: a JSON pointer into it, then a small projection of each item."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    pointer: str = ""
    """RFC 6901 pointer to the part of the response that is the result (``/orders``); empty: all of it."""
    fields: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Result field name → pointer within the result (or within each item of a list): ``{id: /id, total:
    /amount/total}``; empty: the result as it is."""
    max_items: int = Field(50, ge=1, le=1000)
    """Most items of a list result shown (the rest are counted)."""

    @field_validator("pointer")
    @classmethod
    def _check_pointer(cls, v: str) -> str:
        return _pointer(v)

    @field_validator("fields")
    @classmethod
    def _check_fields(cls, v: dict[str, str]) -> dict[str, str]:
        return {name: _pointer(pointer) for name, pointer in v.items()}


class RestToolSpec(BaseModel):
    """One declared REST operation.

    ```yaml
    rest_tools:
      - name: search_orders
        description: Find a customer's orders by status.
        method: GET
        url: https://api.shop.example/v1/customers/{customer_id}/orders
        parameters:
          type: object
          required: [customer_id]
          properties:
            customer_id: {type: string, pattern: "^C[0-9]{6}$"}
            status: {type: string, enum: [open, shipped, refunded]}
        headers: {Authorization: "Bearer {{secret:SHOP_TOKEN}}"}
        result: {pointer: /orders, fields: {id: /id, status: /status}}
    ```
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    description: str = Field(min_length=1, max_length=1024)
    method: HttpMethod
    url: str = Field(min_length=1, max_length=2048)
    """``https://host/path/{arg}``: the scheme and host are fixed, ``{arg}`` fills a path segment from an argument."""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """JSON Schema (2020-12) of the arguments, an ``object``: enums, lengths and patterns are enforced before
    anything is sent. Arguments not in the path go in the query (``GET``, ``DELETE``) or the JSON body."""
    query: tuple[str, ...] = ()
    """Arguments sent in the query string even for a method with a body."""
    headers: dict[str, str] = Field(default_factory=dict, max_length=32)
    """Fixed request headers; a value may hold ``{{secret:NAME}}`` placeholders, which egress fills in for hosts the
    secret is bound to. Arguments never reach a header."""
    side_effect: Literal["read", "write"] | None = None
    """``None``: ``read`` for ``GET``, ``write`` otherwise."""
    risk: Literal["low", "medium", "high"] | None = None
    """``None``: ``low`` for a read, ``medium`` for a write."""
    reversible: bool | None = None
    """``None``: reads are, writes are not (so the default policy asks a person before a write)."""
    idempotent: bool = False
    """The API honours the ``Idempotency-Key`` header sent with every write: then a failed write may be retried."""
    permission: str | None = None
    """Permission the principal needs (``None``: anyone who may talk to the agent)."""
    owner: str | None = Field(None, pattern=r"^[a-z][a-z0-9_:-]{0,63}$")
    """Who provides the operation (``None``: ``rest``; a connector pack's are ``connector:<pack>``)."""
    timeout_s: float = Field(15.0, gt=0, le=120)
    result: RestResult = Field(default_factory=RestResult)

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise ValueError(f"{v!r} is not an http(s) URL with a host")
        if "{" in parts.netloc or "{" in parts.query or "{" in parts.fragment or parts.fragment:
            raise ValueError(f"{v!r}: only path segments may be templated ({{arg}}); the host is fixed")
        if parts.username or parts.password:
            raise ValueError(f"{v!r}: credentials go in headers as {{{{secret:NAME}}}}, never in the URL")
        normalize_pattern(parts.hostname)  # a host name, not a pattern or an address with a port in it
        return v

    @field_validator("parameters")
    @classmethod
    def _check_schema(cls, v: dict[str, Any]) -> dict[str, Any]:
        try:
            Draft202012Validator.check_schema(v)
        except SchemaError as err:
            raise ValueError(f"parameters is not a valid JSON Schema: {err.message}") from None
        if v.get("type") != "object":
            raise ValueError("parameters must be a JSON Schema of `type: object`")
        return v

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, v: dict[str, str]) -> dict[str, str]:
        for name, value in v.items():
            if not _HEADER_NAME.match(name) or name.lower() in ("host", "content-length", "idempotency-key"):
                raise ValueError(f"{name!r} may not be a declared header")
            if "{" in _SECRET_ONLY.sub("", value) or "\n" in value or "\r" in value:
                raise ValueError(f"header {name}: a value is text and {{{{secret:NAME}}}} placeholders only")
        return v

    @model_validator(mode="after")
    def _check_arguments(self) -> RestToolSpec:
        properties = self.parameters.get("properties", {})
        required = set(self.parameters.get("required", []))
        for name in [*path_names(self.url), *self.query]:
            if name not in properties:
                raise ValueError(f"{self.name}: {{{name}}} is not a property of its parameters")
        missing = [name for name in path_names(self.url) if name not in required]
        if missing:
            raise ValueError(f"{self.name}: path arguments must be required ({', '.join(missing)})")
        return self

    @property
    def host(self) -> str:
        """The host every call goes to (lower-case)."""
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def effect(self) -> Literal["read", "write"]:
        """The side-effect class, defaulted from the method."""
        return self.side_effect or ("read" if self.method == "GET" else "write")
