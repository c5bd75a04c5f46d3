"""From OpenAI chat messages to prompt text, and from tools / response formats to grammars.

The chat template is the Jinja template stored in the GGUF (``tokenizer.chat_template``),
rendered in a sandbox. Tools are described in the system message, Hermes style, and a tool call
is written ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Its JSON is constrained by
a GBNF grammar built from the tools' JSON schemas with llama-cpp-python's
``json_schema_to_gbnf``, so arguments always parse and match the schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from inference.chat_request import ToolMode

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


class TemplateError(ValueError):
    """The chat template could not render these messages (or does not load at all)."""


class NoChatTemplate(TemplateError):
    """The model's GGUF carries no chat template: a completion-only package. There is no
    fallback (a base model given ChatML answers with the template's own markers)."""


class ChatFormatter:
    """Renders messages with a model's chat template.

    ``special_texts``: the texts of the model's control tokens (``<|im_end|>`` ...). The prompt
    is tokenized with special tokens parsed, so each one written inside a message would end
    the message or open a forged one (a tool result saying ``<|im_end|><|im_start|>system``);
    inside messages they are defused with a word joiner (U+2060) after their first character
    and reach the model as the text they look like.

    A template that does not compile (an unknown tag) or is missing does not stop the node:
    ``load_error`` says why and every ``render`` raises ``TemplateError`` /
    ``NoChatTemplate`` with that reason, which clients (and the package smoke test) see."""

    def __init__(
        self,
        template: str | None,
        *,
        bos_token: str,
        eos_token: str,
        special_texts: tuple[str, ...] = (),
    ) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        self._template = None
        self.load_error = ""
        if not template:
            self.load_error = (
                "this model's GGUF has no chat template (a completion-only package); chat "
                "completions need a package with a chat template"
            )
        else:
            try:
                self._template = env.from_string(template)
            except Exception as exc:  # jinja's TemplateSyntaxError, and whatever a filter raises
                self.load_error = f"chat template does not load: {exc}"
        self.bos_token = bos_token
        self.eos_token = eos_token
        protocol = (TOOL_OPEN, TOOL_CLOSE, "<tool_response>", "</tool_response>")
        self.special_texts = tuple(t for t in special_texts if t not in protocol)

    def render(
        self,
        messages: list[dict[str, Any]],
        tool_mode: ToolMode | None = None,
        *,
        continue_final: bool = False,
    ) -> str:
        """Prompt text ending with the assistant's turn opener; with ``continue_final``, the
        last message (an assistant's) is not rendered as a closed turn: its text follows the
        opener, so the model goes on writing it (how llama.cpp's server prefills an assistant
        answer). Raises ``TemplateError`` (``NoChatTemplate`` when the model has none)."""
        if continue_final:
            prefix = _flatten(messages[-1])["content"]
            return self.render(messages[:-1], tool_mode) + self._defuse(prefix)
        if self._template is None:
            kind = NoChatTemplate if "no chat template" in self.load_error else TemplateError
            raise kind(self.load_error)
        plain = [_flatten(m) for m in messages]
        if tool_mode:
            plain = _with_tool_instructions(plain, tool_mode)
        plain = [{**m, "content": self._defuse(m["content"])} for m in plain]
        try:
            return self._template.render(
                messages=plain,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except Exception as exc:  # jinja raises many kinds
            raise TemplateError(f"chat template failed: {exc}") from exc

    def _defuse(self, text: str) -> str:
        for special in self.special_texts:
            if special in text:
                text = text.replace(special, special[0] + WORD_JOINER + special[1:])
        return text


WORD_JOINER = "\u2060"


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def _flatten(message: dict[str, Any]) -> dict[str, str]:
    """One message as role + text: content parts joined, tool calls and results written out."""
    role = message["role"]
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    text = content or ""
    for fn in _calls(message) if role == "assistant" else []:
        call = {"name": fn.get("name"), "arguments": _arguments(fn.get("arguments", "{}"))}
        text += f"{TOOL_OPEN}{json.dumps(call)}{TOOL_CLOSE}"
    if role in ("tool", "function"):  # "function": OpenAI's deprecated tool result
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
    return {"role": role if role != "developer" else "system", "content": text}


def _calls(message: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant message's tool calls (``function`` of each) and OpenAI's older single
    ``function_call``. Only assistant messages carry calls (the schema checks their shape
    there); other roles' messages may hold any extra key, which is not read."""
    calls = [c.get("function") or {} for c in message.get("tool_calls") or []]
    if message.get("function_call"):
        calls.append(message["function_call"])
    return calls


TOOL_HOW = (
    "You may call one of these tools. To call a tool, answer with "
    f'{TOOL_OPEN}{{"name": <tool name>, "arguments": <arguments object>}}{TOOL_CLOSE}'
)


def _arguments(args: Any) -> Any:
    """A call's arguments as an object when its JSON string parses (any failure: huge numbers,
    deep nesting, not JSON) keeps the string as the client sent it."""
    if not isinstance(args, str):
        return args
    try:
        return json.loads(args)
    except (ValueError, RecursionError):
        return args


def tools_system_block(tools: Iterable[dict[str, Any]]) -> str:
    """The text that describes ``tools`` (OpenAI ``tools`` entries, or bare function objects)
    in the system message: a ``# Tools`` heading, one JSON function per line inside
    ``<tools>``, then how to write a call. A node appends it to the first system message
    (after a blank line) or sends it as the system message; the tool-call evaluation's free
    mode writes it itself, so both prompts are byte-identical."""
    specs = "\n".join(json.dumps(t.get("function", t)) for t in tools)
    return f"# Tools\n<tools>\n{specs}\n</tools>\n{TOOL_HOW}"


def _with_tool_instructions(messages: list[dict[str, str]], mode: ToolMode) -> list[dict[str, str]]:
    """The tools described in the system message. The text is the same whatever
    ``tool_choice`` says (the grammar enforces it), so a session's prompt keeps its prefix,
    and its cached KV, from one turn to the next."""
    block = tools_system_block(mode.tools)
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"] + "\n\n" + block}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


# Grammars ----------------------------------------------------------------------------------

MAX_GRAMMAR_DEPTH = 256  # llama.cpp parses GBNF recursively: deeper nesting overflows its stack
MAX_GRAMMAR_BYTES = 64 << 10


class GrammarTooComplex(ValueError):
    """A JSON schema whose grammar llama.cpp cannot take safely; the message says why."""


def check_grammar(gbnf: str) -> str:
    """``gbnf`` when llama.cpp can parse it safely; raises ``GrammarTooComplex`` when it is over
    ``MAX_GRAMMAR_BYTES`` or nests groups deeper than ``MAX_GRAMMAR_DEPTH`` (a ``maxLength`` of
    30,000 makes 30,000 nested groups, which crashes the node's parser)."""
    if len(gbnf) > MAX_GRAMMAR_BYTES:
        raise GrammarTooComplex(
            f"its grammar is {len(gbnf):,} bytes (at most {MAX_GRAMMAR_BYTES:,}); "
            "lower maxLength, maxItems or the number of alternatives"
        )
    depth = _group_depth(gbnf)
    if depth > MAX_GRAMMAR_DEPTH:
        raise GrammarTooComplex(
            f"its grammar nests {depth} groups deep (at most {MAX_GRAMMAR_DEPTH}); "
            "lower maxLength, maxItems or minItems"
        )
    return gbnf


def _group_depth(gbnf: str) -> int:
    """The deepest nesting of ``(`` groups, outside string literals and character classes."""
    depth = deepest = 0
    quote: str | None = None
    escaped = False
    for ch in gbnf:
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif quote:
            quote = None if ch == quote else quote
        elif ch in '"[':
            quote = "]" if ch == "[" else '"'
        elif ch == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif ch == ")":
            depth -= 1
    return deepest


def _rename_root(gbnf: str, name: str) -> str:
    return re.sub(r"(?m)^root\s*::=", f"{name} ::=", gbnf)


def tool_call_schema(mode: ToolMode) -> dict[str, Any]:
    """JSON schema of a call ``{"name": ..., "arguments": {...}}`` to one of the allowed tools."""
    fns = [t.get("function", t) for t in mode.tools]
    if mode.choice not in ("auto", "required"):
        fns = [f for f in fns if f.get("name") == mode.choice]
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"const": f["name"]},
                "arguments": f.get("parameters") or {"type": "object", "properties": {}},
            },
            "required": ["name", "arguments"],
        }
        for f in fns
    ]
    return variants[0] if len(variants) == 1 else {"oneOf": variants}


PLAIN_TEXT = "plain-text ::= [^<] [^\\x00]*"


def tool_grammar(mode: ToolMode) -> str:
    """GBNF: a tagged tool call, or (``auto``) plain text that does not start with ``<``, or
    (``none``) that plain text only."""
    if not mode.allows_call:
        return f"root ::= plain-text\n{PLAIN_TEXT}"
    call = _rename_root(json_schema_to_gbnf(json.dumps(tool_call_schema(mode))), "call-json")
    tagged = f'"{TOOL_OPEN}" call-json "{TOOL_CLOSE}"'
    if mode.forces_call:
        return f"root ::= {tagged}\n{call}"
    return f"root ::= {tagged} | plain-text\n{PLAIN_TEXT}\n{call}"


def response_format_grammar(response_format: dict[str, Any] | None) -> str | None:
    """GBNF for ``response_format`` (``json_object`` or ``json_schema``); None for text."""
    if not response_format or response_format.get("type") in (None, "text"):
        return None
    if response_format["type"] == "json_object":
        return JSON_GBNF
    schema = response_format.get("json_schema", {}).get("schema") or {}
    return json_schema_to_gbnf(json.dumps(schema))


def parse_tool_call(text: str) -> dict[str, Any] | None:
    """The ``{"name", "arguments"}`` object of a tagged tool call in ``text``, or None."""
    start = text.find(TOOL_OPEN)
    end = text.find(TOOL_CLOSE, start + 1)
    if start != 0 or end < 0:
        return None
    try:
        call = json.loads(text[len(TOOL_OPEN) : end])
    except (ValueError, RecursionError):  # a model may write JSON nested past the parser's depth
        return None
    return call if isinstance(call, dict) and "name" in call else None
