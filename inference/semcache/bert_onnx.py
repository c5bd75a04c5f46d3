"""A BERT sentence encoder (sentence-transformers' layout: a BERT model, mean pooling, L2
normalisation) written as an ONNX graph from its safetensors weights, for onnxruntime.

The model ships as Hugging Face files (``config.json``, ``model.safetensors``,
``tokenizer.json``); turning them into ONNX usually takes PyTorch (``torch.onnx.export``),
which this project does not install. The graph is small and standard, so it is built here
with ``onnx.helper`` from the weights, op for op as Hugging Face's ``BertModel`` computes it
(embeddings + LayerNorm; per layer self-attention with the padding mask, output dense +
residual LayerNorm, GELU feed-forward + residual LayerNorm), then mean pooling over the
attention mask and L2 normalisation, as sentence-transformers' ``Pooling`` and ``Normalize``.
Inputs ``input_ids`` and ``attention_mask`` (int64, batch x tokens); output ``embeddings``
(float32, batch x hidden, unit length). No Django here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17  # LayerNormalization


class _Graph:
    """Nodes and initializers being collected; ``op`` adds a node and returns its output."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.weights: list[onnx.TensorProto] = []
        self.count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.weights.append(numpy_helper.from_array(value, name))
        return name

    def op(self, kind: str, *inputs: str, **attrs) -> str:
        self.count += 1
        out = f"{kind.lower()}_{self.count}"
        self.nodes.append(helper.make_node(kind, list(inputs), [out], **attrs))
        return out


def _dense(g: _Graph, x: str, weights: dict, prefix: str) -> str:
    """``x @ W.T + b`` of the Linear layer ``prefix``."""
    w = g.const(f"{prefix}.wt", np.ascontiguousarray(weights[f"{prefix}.weight"].T))
    b = g.const(f"{prefix}.b", weights[f"{prefix}.bias"])
    return g.op("Add", g.op("MatMul", x, w), b)


def _norm(g: _Graph, x: str, weights: dict, prefix: str, eps: float) -> str:
    scale = g.const(f"{prefix}.g", weights[f"{prefix}.weight"])
    bias = g.const(f"{prefix}.beta", weights[f"{prefix}.bias"])
    return g.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=eps)


def _attention(g: _Graph, x: str, mask_bias: str, w: dict, p: str, cfg: dict) -> str:
    heads = cfg["num_attention_heads"]
    size = cfg["hidden_size"] // heads
    split = g.const(f"{p}.split", np.array([0, 0, heads, size], dtype=np.int64))
    merged = g.const(f"{p}.merge", np.array([0, 0, heads * size], dtype=np.int64))

    def heads_of(name: str, perm: list[int]) -> str:
        projected = _dense(g, x, w, f"{p}.attention.self.{name}")
        return g.op("Transpose", g.op("Reshape", projected, split), perm=perm)

    q = heads_of("query", [0, 2, 1, 3])
    k = heads_of("key", [0, 2, 3, 1])
    v = heads_of("value", [0, 2, 1, 3])
    scale = g.const(f"{p}.scale", np.array(1 / math.sqrt(size), dtype=np.float32))
    scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), mask_bias)
    context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merged)
    out = _dense(g, context, w, f"{p}.attention.output.dense")
    return _norm(g, g.op("Add", out, x), w, f"{p}.attention.output.LayerNorm", cfg["eps"])


def _feed_forward(g: _Graph, x: str, w: dict, p: str, cfg: dict) -> str:
    h = _dense(g, x, w, f"{p}.intermediate.dense")
    root2 = g.const(f"{p}.root2", np.array(math.sqrt(2.0), dtype=np.float32))
    half = g.const(f"{p}.half", np.array(0.5, dtype=np.float32))
    one = g.const(f"{p}.one", np.array(1.0, dtype=np.float32))
    erf = g.op("Erf", g.op("Div", h, root2))  # exact GELU, as BERT's "gelu"
    h = g.op("Mul", g.op("Mul", h, half), g.op("Add", erf, one))
    out = _dense(g, h, w, f"{p}.output.dense")
    return _norm(g, g.op("Add", out, x), w, f"{p}.output.LayerNorm", cfg["eps"])


def _embeddings(g: _Graph, w: dict, cfg: dict) -> str:
    words = g.op("Gather", g.const("word", w["embeddings.word_embeddings.weight"]), "input_ids")
    length = g.op(
        "Gather",
        g.op("Shape", "input_ids"),
        g.const("axis1", np.array(1, dtype=np.int64)),
    )
    zero = g.const("zero", np.array(0, dtype=np.int64))
    step = g.const("step", np.array(1, dtype=np.int64))
    positions = g.op("Range", zero, length, step)
    table = g.const("position", w["embeddings.position_embeddings.weight"])
    placed = g.op("Add", words, g.op("Gather", table, positions))
    token_type = g.const("type0", w["embeddings.token_type_embeddings.weight"][0])
    return _norm(g, g.op("Add", placed, token_type), w, "embeddings.LayerNorm", cfg["eps"])


def _pooled(g: _Graph, x: str, mask: str) -> str:
    last = g.const("last_axis", np.array([-1], dtype=np.int64))
    tokens_axis = g.const("tokens_axis", np.array([1], dtype=np.int64))
    weights = g.op("Unsqueeze", mask, last)
    summed = g.op("ReduceSum", g.op("Mul", x, weights), tokens_axis, keepdims=0)
    count = g.op("ReduceSum", weights, tokens_axis, keepdims=0)
    floor = g.const("floor", np.array(1e-9, dtype=np.float32))
    mean = g.op("Div", summed, g.op("Max", count, floor))
    return g.op("LpNormalization", mean, axis=1, p=2)


def build(model_dir: str | Path) -> onnx.ModelProto:
    """The ONNX model of the sentence encoder in ``model_dir`` (see the module)."""
    from safetensors.numpy import load_file

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    cfg["eps"] = float(cfg.get("layer_norm_eps", 1e-12))
    w = load_file(str(model_dir / "model.safetensors"))
    g = _Graph()
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    one = g.const("mask_one", np.array(1.0, dtype=np.float32))
    big = g.const("mask_big", np.array(-10000.0, dtype=np.float32))  # BERT's masked score
    axes = g.const("mask_axes", np.array([1, 2], dtype=np.int64))
    mask_bias = g.op("Unsqueeze", g.op("Mul", g.op("Sub", one, mask), big), axes)
    x = _embeddings(g, w, cfg)
    for i in range(cfg["num_hidden_layers"]):
        x = _attention(g, x, mask_bias, w, f"encoder.layer.{i}", cfg)
        x = _feed_forward(g, x, w, f"encoder.layer.{i}", cfg)
    pooled = _pooled(g, x, mask)
    g.nodes.append(helper.make_node("Identity", [pooled], ["embeddings"]))
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "tokens"])
    att = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "tokens"])
    out = helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["batch", None])
    graph = helper.make_graph(g.nodes, "sentence_encoder", [ids, att], [out], g.weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=False)
    return model
