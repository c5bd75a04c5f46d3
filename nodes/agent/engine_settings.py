"""The engine settings a node may be switched to (``PUT /package``'s ``settings``) and their
bounds: one definition for the node's own check (``nodes.agent.switch``) and the control
plane's (``inference.upgrades.plan``, which checks an upgrade's ``node_settings`` before
anything is planned). No Django, no engine: both sides import it.

docs/upgrades.md, "Node settings", says why each bound is what it is.
"""

from __future__ import annotations

# setting -> (lowest, highest), inclusive, whole numbers
LIMITS: dict[str, tuple[int, int]] = {
    "threads": (1, 256),  # decode threads; more than a big server's cores only contend
    "sequences": (1, 256),  # KV sequences (concurrent sessions) in the node's one context
    "ctx_per_seq": (256, 131_072),  # tokens per sequence; the smoke chat needs a few hundred
    "host_ram_mib": (1, 1_048_576),  # idle sessions' KV in host RAM: at most 1 TiB
}
SETTINGS: tuple[str, ...] = tuple(LIMITS)
# sequences * ctx_per_seq: the KV cells of the node's one llama.cpp context. Each bound alone
# allows 256 * 131,072 = 33.5M cells (tens of GiB of KV even for a 135M model); together they
# may ask for at most 2^20, what a big server's RAM holds for the small models Phalanx serves.
MAX_CONTEXT_TOKENS = 1_048_576


def context_refusal(sequences: int, ctx_per_seq: int) -> str | None:
    """Why ``sequences`` sequences of ``ctx_per_seq`` tokens are too many together, naming
    both and the limit; None when they fit ``MAX_CONTEXT_TOKENS``."""
    if sequences * ctx_per_seq <= MAX_CONTEXT_TOKENS:
        return None
    return (
        f"sequences * ctx_per_seq: {sequences} * {ctx_per_seq} = {sequences * ctx_per_seq:,} "
        f"KV cells, over the {MAX_CONTEXT_TOKENS:,} one node's context may hold"
    )


def bounds_sentence(key: str, high: int | None = None) -> str:
    """``"a whole number from 1 to 256"`` for ``key`` (``high`` overrides its upper bound, as
    a package's trained context does for ``ctx_per_seq``). Raises ``KeyError`` for a key
    that is not a setting."""
    low, top = LIMITS[key]
    return f"a whole number from {low} to {top if high is None else high}"
