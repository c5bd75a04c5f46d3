"""The compatibility matrix (``matrix.yaml``, data) applied to one node's facts: a list of rule
results, each pass, warn or fail with a reason a person can act on. Pure: no I/O but reading the
YAML once; tests feed it fixture machines' inventories.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

MATRIX_PATH = Path(__file__).with_name("matrix.yaml")
PASS, WARN, FAIL = "pass", "warn", "fail"
_ORDER = {PASS: 0, WARN: 1, FAIL: 2}
GIB = 1024**3


@functools.cache
def load_matrix(path: Path = MATRIX_PATH) -> dict[str, Any]:
    """The matrix as data (cached)."""
    return yaml.safe_load(path.read_text())


@dataclass(frozen=True)
class RuleResult:
    """One rule's verdict: ``rule`` (its name in matrix.yaml), ``status`` (pass/warn/fail) and
    ``reason`` (what was found and what to do)."""

    rule: str
    status: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class Facts:
    """What the rules look at. ``inventory``: ``nodes.devices.inventory.collect()``;
    ``engine``: the node's settings and model (``threads``, ``sequences``, ``ctx_per_seq``,
    ``kv_bytes_per_token``, ``model_bytes``, ``host_ram_bytes``, ``held_bytes``: memory the
    node process holds now, ``quantization``: the GGUF file type such as ``Q4_K_M``);
    ``bench``: the benchmark figures; ``pool_decode_tok_s_8``: the median of the other nodes
    serving the same package (None when there are none); ``pool_note``: why there is no pool
    median, in the pool rule's words (``nodes.validation_pool.pool_note``)."""

    inventory: dict[str, Any]
    engine: dict[str, Any] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    pool_decode_tok_s_8: float | None = None
    pool_note: str = "no other node serves this package to compare"


def overall(results: list[RuleResult]) -> str:
    """The worst status among ``results`` (pass when empty)."""
    return max((r.status for r in results), key=_ORDER.__getitem__, default=PASS)


def arch_of(inventory: dict[str, Any]) -> str | None:
    """``x86_64`` or ``aarch64`` (py-cpuinfo's raw architecture, normalised), else None."""
    raw = str((inventory.get("cpu") or {}).get("arch") or "").lower()
    if raw in ("x86_64", "amd64", "x64"):
        return "x86_64"
    if raw in ("aarch64", "arm64", "armv8"):
        return "aarch64"
    return None


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _flags(facts: Facts) -> set[str]:
    return set((facts.inventory.get("cpu") or {}).get("flags") or [])


def cpu_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    """Required instruction sets (fail), recommended ones (noted), and flags the CPU has that
    llama.cpp's build does not use (warn)."""
    arch, flags = arch_of(facts.inventory), _flags(facts)
    if arch is None or not flags:
        return [
            RuleResult(
                "cpu.required", WARN, "unknown: the CPU's architecture or flags could not be read"
            )
        ]
    spec = matrix["cpu"]["required"].get(arch, {})
    missing = [f for f in spec.get("all_of", []) if f not in flags]
    results = [
        RuleResult(
            "cpu.required",
            spec.get("status", FAIL),
            f"the CPU lacks {', '.join(missing)}: llama.cpp's {arch} kernels need them to serve "
            "at a usable speed; move the node to a newer CPU",
        )
        if missing
        else RuleResult("cpu.required", PASS, f"{arch} with {', '.join(spec.get('all_of', []))}")
    ]
    wanted = matrix["cpu"]["recommended"].get(arch, [])
    has = [f for f in wanted if f in flags]
    results.append(
        RuleResult(
            "cpu.recommended",
            PASS,
            f"has {', '.join(has) or 'none of them'}"
            + (
                f"; lacks {', '.join(f for f in wanted if f not in flags)}"
                if len(has) < len(wanted)
                else ""
            ),
        )
    )
    return results + build_rules(facts, matrix, flags)


def build_rules(facts: Facts, matrix: dict[str, Any], flags: set[str]) -> list[RuleResult]:
    features = (facts.inventory.get("llama") or {}).get("features") or {}
    if not features:
        return [RuleResult("cpu.build", WARN, "unknown: llama.cpp's system info could not be read")]
    unused = [
        (flag, name)
        for flag, name in matrix["cpu"]["build_features"].items()
        if flag in flags and features.get(name) != "1"
    ]
    if unused:
        return [RuleResult("cpu.build", WARN, _build_advice(unused, matrix))]
    return [
        RuleResult("cpu.build", PASS, "llama.cpp's build uses every instruction set it knows here")
    ]


REBUILD = 'make -B install LLAMA_EXTRA_CMAKE_ARGS="{}"'


def _build_advice(unused: list[tuple[str, str]], matrix: dict[str, Any]) -> str:
    """The cpu.build warning for ``unused`` (``(cpu flag, llama.cpp feature)``): the command
    that rebuilds llama-cpp-python with the options that add them (matrix ``build_options``;
    checked with ``make -n -B``), and what it cannot add, said as such."""
    options = matrix["cpu"].get("build_options") or {}
    named = ", ".join(f"{flag} ({name})" for flag, name in unused)
    adds = [options[name] for _, name in unused if name in options]
    left = [name for _, name in unused if name not in options]
    text = f"the CPU has {named} but this llama.cpp build does not use them"
    if adds:
        text += f": {REBUILD.format(' '.join(adds))} builds it in (then start the nodes again)"
    if left:
        text += (
            f"; {', '.join(left)}: no build option Phalanx knows to work adds it "
            "(docs/validation.md, llama-cpp-python's build)"
        )
    return text


def repack_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    """Whether the package's quantization type gets a repacked CPU kernel on this CPU."""
    quant = str(facts.engine.get("quantization") or "")
    spec = matrix["quantization"].get(quant)
    if spec is None:
        return []
    arch, flags = arch_of(facts.inventory), _flags(facts)
    needs = (spec.get("repack") or {}).get(arch or "", None)
    features = (facts.inventory.get("llama") or {}).get("features") or {}
    instead = spec.get("instead") or "Q4_0 or Q4_K_M"
    if needs is None:
        return [
            RuleResult(
                "quantization.repack",
                WARN,
                f"{quant} has no repacked kernel here; {instead} decodes faster at 8 sequences",
            )
        ]
    lacking = [f for f in needs if f not in flags]
    if lacking:
        return [
            RuleResult(
                "quantization.repack",
                WARN,
                f"{quant}'s repacked kernel needs {', '.join(lacking)}, which this CPU lacks; "
                "it batches several sequences poorly here",
            )
        ]
    if features and features.get("REPACK") not in (None, "1"):
        return [
            RuleResult(
                "quantization.repack",
                WARN,
                f"this llama.cpp build has repacking off (REPACK = {features.get('REPACK')}): "
                f"{quant} batches poorly; "
                + REBUILD.format("-DGGML_CPU_REPACK=ON")
                + " builds it in",
            )
        ]
    return [RuleResult("quantization.repack", PASS, f"{quant} has a repacked kernel on this CPU")]


def memory_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    """KV cache (sequences x context x bytes per token) + model + host-RAM budget against the
    memory free to the node (available, or what its cgroup's limit leaves when tighter) plus
    what the node already holds."""
    e = facts.engine
    memory = facts.inventory.get("memory") or {}
    if not memory.get("available") or not e.get("kv_bytes_per_token"):
        return [
            RuleResult("memory", WARN, "unknown: memory or the KV size per token could not be read")
        ]
    kv = int(e["sequences"]) * int(e["ctx_per_seq"]) * int(e["kv_bytes_per_token"])
    need = kv + int(e.get("model_bytes") or 0) + int(e.get("host_ram_bytes") or 0)
    free, where = int(memory["available"]), "available to this node"
    limit, usage = memory.get("cgroup_limit"), memory.get("cgroup_usage")
    if isinstance(limit, int) and limit - int(usage or 0) < free:
        free, where = limit - int(usage or 0), f"left under its cgroup's limit of {_gib(limit)}"
    have = max(0, free) + int(e.get("held_bytes") or 0)
    what = (
        f"{e['sequences']} sequences × {int(e['ctx_per_seq']):,} tokens need {_gib(kv)} of KV "
        f"cache, {_gib(need)} with the model and host-RAM budget; {_gib(have)} {where}"
    )
    spec = matrix["memory"]
    if need > have * float(spec["fail_above"]):
        return [RuleResult("memory", FAIL, f"{what}: lower sequences or ctx_per_seq")]
    if need > have * float(spec["warn_above"]):
        return [RuleResult("memory", WARN, f"{what}: little room left for the OS and page cache")]
    return [RuleResult("memory", PASS, what)]


def threads_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    budget = facts.inventory.get("cpu_budget") or {}
    cpus, threads = budget.get("cpus"), int(facts.engine.get("threads") or 0)
    if cpus is None or not threads:
        return [RuleResult("threads", WARN, "unknown: the CPU budget could not be read")]
    where = []
    if budget.get("affinity"):
        where.append(f"affinity {len(budget['affinity'])} CPUs")
    if budget.get("cgroup_cpus") is not None:
        where.append(f"cgroup quota {budget['cgroup_cpus']:g} CPUs")
    shown = f"{cpus:g}"
    if threads > cpus:
        return [
            RuleResult(
                "threads",
                matrix["threads"]["status_over_budget"],
                f"threads {threads} > CPU budget {shown} ({', '.join(where)}): set threads to "
                f"{max(1, int(cpus))}",
            )
        ]
    return [
        RuleResult("threads", PASS, f"threads {threads} ≤ CPU budget {shown} ({', '.join(where)})")
    ]


def numa_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    numa = facts.inventory.get("numa") or []
    mine = set((facts.inventory.get("cpu_budget") or {}).get("affinity") or [])
    if len(numa) > 1 and not mine:
        return [RuleResult("numa", WARN, "unknown: the node's CPUs could not be read")]
    if len(numa) <= 1:
        return [
            RuleResult(
                "numa",
                PASS,
                f"{len(numa) or 'one'} NUMA node{'s' if len(numa) > 1 else ''}; nothing to span",
            )
        ]
    spanned = [n["node"] for n in numa if mine & set(n.get("cpus") or [])]
    if len(spanned) > 1:
        return [
            RuleResult(
                "numa",
                matrix["numa"]["status_spanning"],
                f"the node's CPUs span NUMA nodes {', '.join(map(str, spanned))}: pin it to one "
                "NUMA node's CPUs (cpu_set) and run one node per NUMA node",
            )
        ]
    return [
        RuleResult(
            "numa", PASS, f"the node's CPUs sit on NUMA node {spanned[0] if spanned else '?'}"
        )
    ]


def kernel_error_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    errors = facts.inventory.get("kernel_errors") or {}
    spec = matrix["kernel_errors"]
    if errors.get("status") != "ok":
        detail = errors.get("detail") or errors.get("status") or "no answer"
        word = "not permitted" if errors.get("status") == "not_permitted" else "unknown"
        return [
            RuleResult(
                "kernel_errors",
                spec["status_unknown"],
                f"{word}: dmesg ({detail}); read the host's kernel log (journalctl -k) by hand",
            )
        ]
    if errors.get("count"):
        first = (errors.get("lines") or [""])[0]
        return [
            RuleResult(
                "kernel_errors",
                spec["status_found"],
                f"{errors['count']} kernel errors since boot, the first: {first[:200]}",
            )
        ]
    return [RuleResult("kernel_errors", PASS, "no kernel errors since boot")]


def _version_tuple(text: str) -> tuple[int, ...]:
    """``"535.161.08"`` -> ``(535, 161, 8)``: the leading dotted numbers; () when there are
    none ("N/A")."""
    match = re.match(r"\s*(\d+(?:\.\d+)*)", str(text))
    return tuple(int(p) for p in match.group(1).split(".")) if match else ()


def accelerator_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    """Per accelerator family present: its module loaded, its driver at the minimum version,
    and a llama.cpp backend built for it."""
    accelerators = facts.inventory.get("accelerators") or {}
    devices = accelerators.get("pci") or []
    results: list[RuleResult] = []
    if (accelerators.get("lspci") or {}).get("status") not in (None, "ok"):
        detail = (accelerators.get("lspci") or {}).get("detail") or "lspci failed"
        results.append(
            RuleResult("accelerators", WARN, f"unknown: {detail} (install Debian's pciutils)")
        )
    for family, spec in matrix["accelerators"].items():
        found = [d for d in devices if d.get("vendor_id") == spec["pci_vendor"]]
        if found:
            results += _family_rules(facts, family, spec, found)
    if not results:
        results.append(
            RuleResult("accelerators", PASS, "no accelerator: the node serves from its CPUs")
        )
    return results


def _driver_version(facts: Facts, spec: dict[str, Any]) -> str:
    gpus = ((facts.inventory.get("accelerators") or {}).get("nvidia_smi") or {}).get("gpus") or []
    if spec["pci_vendor"] == "10de" and gpus:
        return str(gpus[0].get("driver_version") or "")
    loaded = (facts.inventory.get("modules") or {}).get("loaded") or {}
    return next((loaded[m] for m in spec["modules"] if loaded.get(m)), "")


def _family_rules(
    facts: Facts, family: str, spec: dict[str, Any], found: list[dict[str, Any]]
) -> list[RuleResult]:
    """Module loaded, driver at the minimum, backend built in. A missing module or an old
    driver fails a node whose llama.cpp would use the device; without that backend the node
    serves from its CPUs anyway, so they only warn."""
    rule = f"accelerators.{family}"
    names = "; ".join(d.get("name", "?") for d in found)
    built = bool(
        set((facts.inventory.get("llama") or {}).get("backends") or []) & set(spec["backends"])
    )
    severe = FAIL if built else WARN
    modules = facts.inventory.get("modules") or {}
    loaded = modules.get("loaded") or {}
    if modules.get("status") == "ok" and not any(m in loaded for m in spec["modules"]):
        return [
            RuleResult(
                rule,
                severe,
                f"{names} present but its module ({' or '.join(spec['modules'])}) is not loaded: "
                "install the vendor's driver and modprobe it",
            )
        ]
    version = _driver_version(facts, spec)
    minimum = str(spec.get("min_driver") or "")
    if minimum and version and not _version_tuple(version):
        return [RuleResult(rule, WARN, f"{names}: driver version {version!r} cannot be read")]
    if minimum and version and _version_tuple(version) < _version_tuple(minimum):
        return [
            RuleResult(
                rule,
                severe,
                f"{names}: driver {version} is older than {minimum}, the matrix's minimum: "
                "upgrade the driver",
            )
        ]
    if not built:
        return [
            RuleResult(
                rule,
                WARN,
                f"{names} present (driver {version or 'unknown'}) but this llama.cpp build has no "
                f"{' or '.join(spec['backends'])} backend: the node serves from its CPUs",
            )
        ]
    return [RuleResult(rule, PASS, f"{names}, driver {version or 'unknown'}, backend built in")]


def pool_rules(facts: Facts, matrix: dict[str, Any]) -> list[RuleResult]:
    mine, pool = facts.bench.get("decode_tok_s_8"), facts.pool_decode_tok_s_8
    if not mine:
        return [RuleResult("pool", WARN, "unknown: the model benchmark gave no decode figure")]
    if not pool:
        return [
            RuleResult(
                "pool",
                PASS,
                f"decodes {mine:.1f} tok/s at 8 sequences; {facts.pool_note}",
            )
        ]
    ratio = mine / pool
    status = WARN if ratio < float(matrix["pool"]["warn_below"]) else PASS
    advice = (
        ": look for a busy neighbour, a lower clock or fewer memory channels"
        if status == WARN
        else ""
    )
    return [
        RuleResult(
            "pool",
            status,
            f"decodes {mine:.1f} tok/s at 8 sequences, {ratio:.0%} of the pool's median {pool:.1f}{advice}",
        )
    ]


RULES = (
    cpu_rules,
    repack_rules,
    memory_rules,
    threads_rules,
    numa_rules,
    kernel_error_rules,
    accelerator_rules,
    pool_rules,
)


def evaluate(facts: Facts, matrix: dict[str, Any] | None = None) -> list[RuleResult]:
    """Every rule of the matrix applied to ``facts``, in a fixed order."""
    matrix = matrix or load_matrix()
    return [result for rule in RULES for result in rule(facts, matrix)]
