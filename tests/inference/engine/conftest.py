from __future__ import annotations

import queue
from dataclasses import dataclass

import pytest

from inference.engine.config import EngineConfig
from inference.engine.prompt import ChatFormatter
from inference.engine.request import Failed, Finished, Request, TextDelta
from inference.engine.sampling import SamplingParams
from inference.engine.scheduler import Engine
from tests.support.processes import bundled_model_path


@dataclass
class Run:
    """A request submitted to a test engine; ``wait()`` collects its deltas and last event."""

    engine: Engine
    request: Request
    events: queue.Queue

    def wait(self, timeout: float = 120.0) -> tuple[list[str], Finished]:
        deltas: list[str] = []
        while True:
            event = self.events.get(timeout=timeout)
            if isinstance(event, TextDelta):
                deltas.append(event.text)
            elif isinstance(event, Failed):
                raise AssertionError(event.message)
            else:
                return deltas, event


class EngineDriver:
    """Chat-level helpers over a real engine with the bundled model."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        model = engine.model
        self.formatter = ChatFormatter(
            model.meta("tokenizer.chat_template"),
            bos_token=model.bos_token,
            eos_token=model.eos_token,
        )

    def tokens(self, messages: list[dict]) -> list[int]:
        return self.engine.model.tokenize(self.formatter.render(messages))

    def prepare(self, messages: list[dict], *, session: str | None = None, **params) -> Run:
        params.setdefault("temperature", 0.0)
        params.setdefault("max_tokens", 24)
        events: queue.Queue = queue.Queue()
        request = Request(
            prompt=self.tokens(messages),
            params=SamplingParams(**params),
            sink=events.put,
            session_id=session,
        )
        return Run(self.engine, request, events)

    def submit(self, messages: list[dict], *, session: str | None = None, **params) -> Run:
        run = self.prepare(messages, session=session, **params)
        self.engine.submit(run.request)
        return run

    def chat(self, messages: list[dict], **kw) -> Finished:
        return self.submit(messages, **kw).wait()[1]


def make_engine(**overrides) -> Engine:
    """A started engine with the bundled model; repeatable unless ``overrides`` say otherwise
    (the engine tests compare texts of cached and fresh prefixes)."""
    defaults = {"sequences": 4, "ctx_per_seq": 1024, "threads": 2, "host_ram_mib": 64}
    config = EngineConfig(
        model_path=str(bundled_model_path()),
        **{**defaults, "repeatable": True, **overrides},
    )
    engine = Engine(config)
    engine.start()
    assert engine.ready.wait(120), engine.load_error
    return engine


@pytest.fixture(scope="module")
def driver():
    engine = make_engine()
    yield EngineDriver(engine)
    engine.stop()


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]
