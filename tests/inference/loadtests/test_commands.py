"""``manage.py loadtest`` where its input enters: a target that cannot prove it is this control
plane is refused naming ``token`` (and sees no credential), and a scenario file nested too deep
names ``yaml`` (a database never migrated: tests/console/test_commands.py)."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from tests.inference.loadtests.throwaway import stranger_server


@pytest.mark.django_db(transaction=True)
def test_a_loopback_stranger_without_a_token_is_refused_naming_token():
    with stranger_server() as stranger:
        with pytest.raises(CommandError) as caught:
            call_command("loadtest", "ramp-quick", "--target", stranger.url, "--quiet")
    assert str(caught.value).startswith("token: ")
    assert "did not prove it is this control plane" in str(caught.value)
    assert stranger.credentials() == []


@pytest.mark.django_db(transaction=True)
def test_a_scenario_file_nested_too_deep_names_yaml(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("name: d\nsteps: [1]\nturns: " + "[" * 3000 + "]" * 3000 + "\n")
    with pytest.raises(CommandError) as caught:
        call_command("loadtest", "--file", str(deep), "--quiet")
    assert "yaml: nested more than 8 levels deep" in str(caught.value)
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00name")
    with pytest.raises(CommandError) as caught:
        call_command("loadtest", "--file", str(binary), "--quiet")
    assert str(caught.value).startswith("--file: ")
