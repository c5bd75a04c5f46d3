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
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from llama_cpp.llama_grammar import JSON_GBNF, json_schema_to_gbnf

from inference.chat_request import ToolMode

TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"

# ChatML, for models whose GGUF carries no template.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TemplateError(ValueError):
    """The chat template could not render these messages."""


class ChatFormatter:
    """Renders messages with a model's chat template."""

    def __init__(self, template: str | None, *, bos_token: str, eos_token: str) -> None:
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_template_error
        self._template = env.from_string(template or CHATML_TEMPLATE)
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(self, messages: list[dict[str, Any]], tool_mode: ToolMode | None = None) -> str:
        """Prompt text ending with the assistant's turn opener. Raises ``TemplateError``."""
        plain = [_flatten(m) for m in messages]
        if tool_mode:
            plain = _with_tool_instructions(plain, tool_mode)
        try:
            return self._template.render(
                messages=plain,
                add_generation_prompt=True,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
            )
        except Exception as exc:  # jinja raises many kinds
            raise TemplateError(f"chat template failed: {exc}") from exc


def _raise_template_error(message: str) -> None:
    raise TemplateError(message)


def _flatten(message: dict[str, Any]) -> dict[str, str]:
    """One message as role + text: content parts joined, tool calls and results written out."""
    role = message["role"]
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
    text = content or ""
    for call in message.get("tool_calls") or []:
        fn = call.get("function", {})
        args = fn.get("arguments", "{}")
        try:
            args_obj = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            args_obj = args
        text += (
            f"{TOOL_OPEN}{json.dumps({'name': fn.get('name'), 'arguments': args_obj})}{TOOL_CLOSE}"
        )
    if role in ("tool", "function"):  # "function": OpenAI's deprecated tool result
        return {"role": "user", "content": f"<tool_response>\n{text}\n</tool_response>"}
    return {"role": role if role != "developer" else "system", "content": text}


TOOL_HOW = (
    "You may call one of these tools. To call a tool, answer with "
    f'{TOOL_OPEN}{{"name": <tool name>, "arguments": <arguments object>}}{TOOL_CLOSE}'
)


def _with_tool_instructions(messages: list[dict[str, str]], mode: ToolMode) -> list[dict[str, str]]:
    """The tools described in the system message. The text is the same whatever
    ``tool_choice`` says (the grammar enforces it), so a session's prompt keeps its prefix,
    and its cached KV, from one turn to the next."""
    specs = "\n".join(json.dumps(t.get("function", t)) for t in mode.tools)
    block = f"# Tools\n<tools>\n{specs}\n</tools>\n{TOOL_HOW}"
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": messages[0]["content"] + "\n\n" + block}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


# Grammars ----------------------------------------------------------------------------------


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
    except json.JSONDecodeError:
        return None
    return call if isinstance(call, dict) and "name" in call else None
