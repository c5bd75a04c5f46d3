"""An embedding package in the admin API and the pages: listed with its kind and its
evaluation figures, and refused wherever a chat package is meant (a node, an upgrade, the chat
evaluation, a build, a chat template), naming what is wrong."""

from __future__ import annotations

import pytest

from inference.models import ModelPackage
from inference.semcache.package import PACKAGE_NAME, embedding_package_register
from nodes.models import Node
from tests.console.test_pages import visible_text

pytestmark = pytest.mark.django_db


@pytest.fixture
def encoder_package(db) -> ModelPackage:
    return embedding_package_register()


def refused_as_embedding(response) -> None:
    assert response.status_code == 422, response.content
    body = response.json()
    assert body["code"] == "package_embedding" and "embedding model" in body["detail"]


def test_the_api_lists_each_package_with_its_kind(api, package, encoder_package):
    listed = {p["key"]: p for p in api("viewer", "get", "/packages").json()}
    assert listed[package.key]["kind"] == "chat"
    assert listed[encoder_package.key]["kind"] == "embedding"
    shown = api("viewer", "get", f"/packages/{encoder_package.pk}")
    assert shown.status_code == 200
    body = shown.json()
    assert body["evaluation"]["near_miss_false_hits"] == 0 and body["gguf"]["exists"] is True
    assert body["gguf"]["error"] == "" and body["gguf"]["architecture"] == "bert"


def test_a_node_cannot_be_given_the_embedding_package(api, node, encoder_package):
    new = {"node_id": "node-02", "address": "127.0.0.1:9402", "package": PACKAGE_NAME}
    refused_as_embedding(api("admin", "post", "/nodes", new))
    assert not Node.objects.filter(node_id="node-02").exists()
    patched = api("admin", "patch", "/nodes/node-01", {"package_id": encoder_package.pk})
    refused_as_embedding(patched)
    assert Node.objects.get(node_id="node-01").package_id != encoder_package.pk


def test_the_node_form_does_not_take_the_embedding_package(login, node, encoder_package):
    page = login("admin").get("/nodes/node-01/edit/").content.decode()
    assert f'value="{encoder_package.pk}"' not in page
    posted = login("admin").post(
        "/nodes/node-01/edit/",
        {"node_id": "node-01", "kind": "phalanx", "address": node.address, "weight": 1,
         "threads": 1, "package": encoder_package.pk},
    )  # fmt: skip
    assert posted.status_code == 200 and "embedding package" in visible_text(posted)
    assert Node.objects.get(node_id="node-01").package_id != encoder_package.pk


def test_an_upgrade_to_the_embedding_package_is_refused(api, node, package, encoder_package):
    body = {"from_package_id": package.pk, "to_package_id": encoder_package.pk}
    response = api("operator", "post", "/upgrades", body)
    refused_as_embedding(response)
    assert response.json()["field"] == "to_package_id"


def test_chat_evaluations_builds_and_templates_refuse_it(api, encoder_package):
    path = f"/packages/{encoder_package.pk}"
    refused_as_embedding(api("operator", "post", f"{path}/evaluate", {}))
    refused_as_embedding(api("operator", "post", f"{path}/quantize", {"quantization": "Q4_K_M"}))
    refused_as_embedding(api("admin", "post", f"{path}/template", {"chat_template": "{{ x }}"}))


def test_the_pages_show_the_kind_and_the_embedding_figures(login, package, encoder_package):
    listing = login("viewer").get("/packages/").content.decode()
    assert 'class="tag kind-embedding"' in listing and "paraphrases served" in listing
    page = login("viewer").get(f"/packages/{encoder_package.pk}/")
    text = visible_text(page)
    assert 'id="embedding-evaluation"' in page.content.decode()
    assert "Near-misses served (false hits) 0" in text and "smoke test" not in text.lower()
