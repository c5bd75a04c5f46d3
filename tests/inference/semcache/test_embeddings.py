"""``POST /v1/embeddings`` (OpenAI's shape, the OpenAI SDK) with all-MiniLM-L6-v2 on
onnxruntime, its graph built from the package's weights (inference/semcache)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from django.conf import settings
from django.test import Client
from openai import OpenAI

from inference.semcache.encoder import DIMENSIONS, MODEL_NAME, shared_encoder

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def encoder():
    return shared_encoder(settings.MODEL_DIR / "embeddings")


def test_it_scores_as_sentence_transformers_documents_this_model(encoder) -> None:
    # sentence-transformers' own example for all-MiniLM-L6-v2 gives 0.7553 for this pair
    a, b, other = encoder.embed(
        [
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The girl is carrying a baby.",
        ]
    )
    assert abs(float(a @ b) - 0.7553) < 0.005
    assert float(a @ other) < 0.1
    assert np.allclose(np.linalg.norm([a, b, other], axis=1), 1.0, atol=1e-5)


def test_the_openai_sdk_gets_embeddings_in_both_encodings(live_server, token) -> None:
    sdk = OpenAI(base_url=f"{live_server.url}/v1", api_key=token, max_retries=0)
    texts = ["Turn on the kitchen lights", "Switch the kitchen lights on"]
    floats = sdk.embeddings.create(model=MODEL_NAME, input=texts, encoding_format="float")
    packed = sdk.embeddings.create(model=MODEL_NAME, input=texts)  # the SDK asks for base64
    assert [len(d.embedding) for d in floats.data] == [DIMENSIONS, DIMENSIONS]
    assert np.allclose(floats.data[1].embedding, packed.data[1].embedding, atol=1e-6)
    a, b = (np.array(d.embedding) for d in floats.data)
    assert float(a @ b) > 0.8 and floats.usage.prompt_tokens > 8


def ask(token: str | None, body: dict):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return Client().post(
        "/v1/embeddings", json.dumps(body), content_type="application/json", headers=headers
    )


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "text-embedding-3-small", "input": "x"}, 404, "model"),
        ({"model": MODEL_NAME, "input": []}, 400, "input"),
        ({"model": MODEL_NAME, "input": [[1, 2, 3]]}, 400, "input"),
        ({"model": MODEL_NAME, "input": "x", "encoding_format": "hex"}, 400, "encoding_format"),
        ({"model": MODEL_NAME, "input": "x", "dimensions": 128}, 400, "dimensions"),
    ],
)
def test_a_request_it_cannot_answer_names_what_is_wrong(token, body, status, param) -> None:
    response = ask(token, body)
    assert response.status_code == status and response.json()["error"]["param"] == param


def test_it_needs_a_token() -> None:
    assert ask(None, {"model": MODEL_NAME, "input": "x"}).status_code == 401


def test_a_request_past_the_size_bounds_is_refused(token) -> None:
    many = ask(token, {"model": MODEL_NAME, "input": ["x"] * 257})
    big = ask(token, {"model": MODEL_NAME, "input": ["y" * 30000] * 7})
    assert many.status_code == 400 and "at most 256 texts" in many.json()["error"]["message"]
    assert big.status_code == 400 and "split it" in big.json()["error"]["message"]


async def test_past_its_slots_the_encoder_answers_503_with_retry_after(token) -> None:
    import asyncio

    from django.test import AsyncClient

    body = json.dumps({"model": MODEL_NAME, "input": ["a long enough text " * 40] * 64})
    headers = {"Authorization": f"Bearer {token}"}

    async def one():
        return await AsyncClient().post(
            "/v1/embeddings", body, content_type="application/json", headers=headers
        )

    answers = await asyncio.gather(*(one() for _ in range(4)))
    statuses = sorted(a.status_code for a in answers)
    assert statuses == [200, 200, 503, 503]
    assert all(a["Retry-After"] == "1" for a in answers if a.status_code == 503)
