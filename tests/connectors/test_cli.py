"""``switchboard connectors list|show``: the packs, their operations, and what an agent gets."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from switchboard.cli.main import main
from tests.connectors.test_loader import BASE


@pytest.fixture
def configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "switchboard.yaml"
    raw = yaml.safe_load(yaml.safe_dump(BASE))
    raw["connectors"]["calendar"] = {"calendar_id": "team@example.com", "token": "CAL", "approve_writes": False}
    config.write_text(yaml.safe_dump(raw))
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    monkeypatch.setenv("SWITCHBOARD_DATA_DIR", str(tmp_path / "data"))


@pytest.mark.usefixtures("configured")
def test_list_names_each_pack_with_its_reads_writes_and_agents(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors", "list"]) == 0
    lines = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["tracker"][1:4] == ["3", "2", "support"]
    assert lines["calendar"][1:4] == ["3", "2", "-"]


@pytest.mark.usefixtures("configured")
def test_show_prints_operations_and_what_the_agent_gets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors", "show", "tracker", "--agent", "support"]) == 0
    out = capsys.readouterr().out
    assert "tracker_comment              POST    write  medium      20s  approve" in out
    assert "tracker_get_issue            GET     read   low         15s  -" in out
    assert "egress:  api.github.com" in out
    assert "rule:    connector:tracker_open_issue: approve" in out


@pytest.mark.usefixtures("configured")
def test_show_says_when_writes_are_relaxed_and_an_agent_lacks_the_pack(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors", "show", "calendar", "--agent", "support"]) == 0
    out = capsys.readouterr().out
    assert "calendar_create_event        POST    write  medium      20s  allow (approve_writes: false)" in out
    assert "/calendars/team@example.com/" not in out  # the table shows operations, not URLs
    assert "does not switch calendar on: add it to agents.support.connectors" in out


@pytest.mark.usefixtures("configured")
def test_show_of_an_unknown_pack_names_the_packs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["connectors", "show", "crm"]) == 2
    err = capsys.readouterr().err
    assert "no connector pack 'crm' (packs: " in err and "calendar" in err and "tracker" in err


def test_show_of_a_pack_not_configured_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "switchboard.yaml"
    config.write_text(yaml.safe_dump(BASE))
    monkeypatch.setenv("SWITCHBOARD_CONFIG", str(config))
    monkeypatch.setenv("SWITCHBOARD_DATA_DIR", str(tmp_path / "data"))
    assert main(["connectors", "show", "calendar"]) == 0
    out = capsys.readouterr().out
    assert "not configured (" in out and "connectors.calendar.token is missing" in out
    assert "token           (required)" in out
    assert "calendar_create_event        POST    write  medium      20s  approve" in out
