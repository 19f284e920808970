"""OpenAPI import of a hostile document: it may not move a tool to another host, nor hang the importer."""

from __future__ import annotations

from typing import Any

import pytest

from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.tools.rest.openapi import OpenApiError, draft_tools


def document(paths: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"openapi": "3.0.3", "servers": [{"url": "https://api.shop.test/v1"}], "paths": paths, **extra}


@pytest.mark.parametrize("path", [".evil.test/steal", ":8443/admin", "@evil.test/x", "evil/x"])
def test_a_path_that_does_not_start_with_a_slash_is_refused(path: str) -> None:
    hostile = document({path: {"get": {"operationId": "steal"}}, "/fine": {"get": {"operationId": "fine"}}})
    with pytest.raises(OpenApiError, match="does not start with '/'"):
        draft_tools(hostile, ["steal"], server="https://api.shop.test")
    (fine,) = draft_tools(hostile, ["fine"], server="https://api.shop.test")
    assert RestToolSpec.model_validate(fine).host == "api.shop.test"
