from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nodes.devices.host import RecordedHost

MACHINES = Path(__file__).with_name("machines")


@pytest.fixture
def machine():
    """``machine(name)``: the fixture machine as a ``RecordedHost``."""
    return lambda name: RecordedHost(MACHINES / name)


@pytest.fixture
def machine_copy(tmp_path):
    """``machine_copy(name)``: a writable copy of a fixture machine (its directory)."""

    def copy(name: str) -> Path:
        target = tmp_path / name
        shutil.copytree(MACHINES / name, target)
        return target

    return copy
