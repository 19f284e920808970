"""``switchboard tools import openapi``: declarations drafted from the petstore document, loadable as written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.rest.declaration import RestToolSpec
from switchboard.core.tools.rest.openapi import OpenApiError, draft_tools, tool_name
from switchboard.core.tools.rest.tool import build_rest_tool
from switchboard.egress.transport import register_rest_tools
from switchboard.settings import load_settings

PETSTORE = Path(__file__).parent / "data" / "petstore.yaml"


def petstore() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(PETSTORE.read_text())
    return loaded


def sb(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("operation", "expected"),
    [("findPetsByStatus", "find_pets_by_status"), ("getPetById", "get_pet_by_id"), ("addPet", "add_pet")],
)
def test_operation_ids_become_snake_case_names(operation: str, expected: str) -> None:
    assert tool_name(operation) == expected


def test_a_query_operation_keeps_its_enum_and_its_api_key_becomes_a_placeholder() -> None:
    (draft,) = draft_tools(petstore(), ["findPetsByStatus"])
    assert (draft["method"], draft["url"]) == ("GET", "https://petstore.example.test/api/v3/pet/findByStatus")
    assert draft["parameters"]["properties"]["status"]["enum"] == ["available", "pending", "sold"]
    assert draft["parameters"]["required"] == ["status"]
    assert draft["headers"] == {"api_key": "{{secret:API_KEY}}"}
    tool = build_rest_tool(RestToolSpec.model_validate(draft), None)
    assert (tool.side_effect, tool.cost) == ("read", 1)
    with pytest.raises(ValueError, match="is not one of"):
        tool.input.model_validate({"status": "stolen"})


def test_path_parameters_of_the_path_item_and_a_body_with_refs_are_inlined() -> None:
    get, add, form = draft_tools(petstore(), ["getPetById", "addPet", "updatePetWithForm"])
    assert get["url"].endswith("/pet/{petId}") and get["parameters"]["required"] == ["petId"]
    assert get["parameters"]["properties"]["petId"]["minimum"] == 1
    body = add["parameters"]["properties"]
    assert "id" not in body  # readOnly: the server sets it
    assert body["category"]["properties"]["name"] == {"type": "string"}  # $ref inlined, example dropped
    assert body["nickname"]["type"] == ["string", "null"]  # OpenAPI's nullable in JSON Schema
    assert add["parameters"]["required"] == ["name", "photoUrls"]
    assert form["query"] == ["name", "status"]  # query parameters of a POST stay in the query
    tool = build_rest_tool(RestToolSpec.model_validate(add), None)
    assert (tool.side_effect, tool.risk, tool.reversible) == ("write", "medium", False)


def test_a_bearer_scheme_of_one_operation_wins_over_the_documents() -> None:
    (draft,) = draft_tools(petstore(), ["getOrderById"])
    assert draft["headers"] == {"Authorization": "Bearer {{secret:STORE_AUTH}}"}


@pytest.mark.parametrize(
    ("only", "server", "expected"),
    [
        (["nope"], None, "no operation nope in the document (it has: addPet, deletePet"),
        (["uploadFile"], None, "only a JSON request body can be drafted"),
        ([], None, "name the operations to draft"),
        (["getPetById"], "/relative", "is not absolute"),
    ],
)
def test_what_cannot_be_drafted_is_an_error_naming_why(only: list[str], server: str | None, expected: str) -> None:
    with pytest.raises(OpenApiError, match=expected.replace("(", r"\(")):
        draft_tools(petstore(), only, server=server)


def test_not_an_openapi_3_document_is_refused() -> None:
    with pytest.raises(OpenApiError, match="not an OpenAPI 3 document"):
        draft_tools({"swagger": "2.0", "paths": {}}, ["x"])


def test_the_command_prints_drafts_that_load_and_register_as_written(base_env: dict[str, str], tmp_path: Path) -> None:
    config = Path(base_env["SWITCHBOARD_CONFIG"])
    env = base_env | {"SWITCHBOARD_CONFIG": str(config)}
    only = "findPetsByStatus,getPetById,addPet"
    done = sb("tools", "import", "openapi", str(PETSTORE), "--agent", "assistant", "--only", only, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("# REST tools drafted from petstore.yaml")
    drafted = yaml.safe_load(done.stdout)["agents"]["assistant"]
    assert drafted["egress"]["allow"] == ["petstore.example.test"]  # the host the agent may not reach yet
    assert [t["name"] for t in drafted["rest_tools"]] == ["find_pets_by_status", "get_pet_by_id", "add_pet"]
    merged = yaml.safe_load(config.read_text())
    merged["agents"]["assistant"].update(drafted)
    config.write_text(yaml.safe_dump(merged))
    settings = load_settings(env)
    registry = ToolRegistry()
    register_rest_tools(registry, settings, None)
    assert sorted(registry.names()) == ["add_pet", "find_pets_by_status", "get_pet_by_id"]
    out = tmp_path / "drafts.yaml"
    written = sb(
        "tools", "import", "openapi", str(PETSTORE), "--agent", "assistant", "--only", only, "--out", str(out), env=env
    )
    assert written.returncode == 0 and yaml.safe_load(out.read_text())["agents"]["assistant"]["rest_tools"]
    again = sb(
        "tools", "import", "openapi", str(PETSTORE), "--agent", "assistant", "--only", only, "--out", str(out), env=env
    )
    assert again.returncode == 2 and "never overwritten" in again.stderr
    unknown = sb("tools", "import", "openapi", str(PETSTORE), "--agent", "assistant", "--only", "ghost", env=env)
    assert unknown.returncode == 1 and "no operation ghost" in unknown.stderr
