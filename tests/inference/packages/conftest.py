"""Package lifecycle tests: a package store of their own under a temporary PHALANX_HOME."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.packages.gguf_files import write_with_chat_template
from tests.support.processes import bundled_model_path


@pytest.fixture
def home(settings, tmp_path) -> Path:
    """``settings.VAR_DIR`` (the store's root, and a job process's PHALANX_HOME) in tmp."""
    settings.VAR_DIR = tmp_path / "home"
    settings.VAR_DIR.mkdir()
    return settings.VAR_DIR


@pytest.fixture(scope="session")
def bundled() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF."""
    return bundled_model_path()


@pytest.fixture(scope="session")
def bare_gguf(bundled, tmp_path_factory) -> Path:
    """The bundled model written without a chat template (``write_with_chat_template(...,
    None)``), once for the session: a rewrite of the whole file takes seconds. Read it, never
    change it."""
    path = tmp_path_factory.mktemp("bare") / "base.gguf"
    write_with_chat_template(bundled, path, None)
    return path
