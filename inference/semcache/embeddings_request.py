"""``POST /v1/embeddings``' request, checked where it enters (OpenAI's shape: ``input`` a
string or a list of strings, ``model``, ``encoding_format`` float or base64, ``dimensions``).
Which embedding package ``model`` names is the view's question
(``inference.semcache.package.embedding_for_request``). No Django here."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference.errors import BadRequest
from inference.semcache.encoder import DIMENSIONS

MAX_INPUTS = 256  # texts a request (the encoder takes about 70 ms a long one on one core)
MAX_INPUT_CHARS = 32768  # a text past this is refused, not silently cut
MAX_TOTAL_CHARS = 200_000  # a request's texts together: about 10 s of one core at most


@dataclass(frozen=True)
class EmbeddingsRequest:
    model: str
    texts: list[str]
    base64: bool


def check_embeddings_body(body: dict[str, Any]) -> EmbeddingsRequest:
    """The request ``body`` asks for; ``BadRequest`` (400) naming the field that is wrong."""
    model = body.get("model")
    if not isinstance(model, str) or not model.strip():
        raise BadRequest("model: required, a string", param="model")
    texts = _texts(body.get("input"))
    encoding = body.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest("encoding_format: must be float or base64", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != DIMENSIONS:
        raise BadRequest(
            f"dimensions: the embedding models give {DIMENSIONS} (they cannot shorten their "
            "vectors)",
            param="dimensions",
        )
    return EmbeddingsRequest(model=model, texts=texts, base64=encoding == "base64")


def _texts(value: Any) -> list[str]:
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, list) or not texts:
        raise BadRequest("input: a string or a non-empty list of strings", param="input")
    if len(texts) > MAX_INPUTS:
        raise BadRequest(f"input: at most {MAX_INPUTS} texts a request", param="input")
    if sum(len(t) for t in texts if isinstance(t, str)) > MAX_TOTAL_CHARS:
        raise BadRequest(
            f"input: at most {MAX_TOTAL_CHARS} characters a request; split it", param="input"
        )
    for i, text in enumerate(texts):
        if not isinstance(text, str):
            raise BadRequest(
                f"input[{i}]: a string (token arrays are not taken: send the text)",
                param="input",
            )
        if not text.strip():
            raise BadRequest(f"input[{i}]: empty text", param="input")
        if len(text) > MAX_INPUT_CHARS:
            raise BadRequest(f"input[{i}]: longer than {MAX_INPUT_CHARS} characters", param="input")
    return texts


def embeddings_body(
    vectors: np.ndarray, *, base64_encoded: bool, tokens: int, model: str
) -> dict[str, Any]:
    """OpenAI's answer: ``{"object": "list", "data": [{"object": "embedding", "index",
    "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}``; ``model`` is the
    embedding package's family; base64: the float32 little-endian bytes, as OpenAI encodes
    them."""
    data = []
    for i, row in enumerate(vectors):
        if base64_encoded:
            embedding: Any = base64.b64encode(row.astype("<f4").tobytes()).decode()
        else:
            embedding = [round(float(x), 7) for x in row]
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"object": "list", "data": data, "model": model, "usage": usage}
