"""The OpenAI chat-completion request schema, taken from the ``openai`` package's own types.

The SDK describes a request body as ``TypedDict`` s (``CompletionCreateParamsBase``,
``ChatCompletionMessageParam`` ...), generated from OpenAI's OpenAPI spec. They are written for
Python callers, so lists are typed ``Iterable`` / ``SequenceNotStr``; ``json_shaped`` rebuilds
them with ``list`` (what JSON has) and with each union of message or part types discriminated by
its ``role`` / ``type`` literal, and ``schema_problem`` validates a decoded body against that with
pydantic in strict mode. Unknown fields pass (llama.cpp's own sampling fields such as ``top_k``).

Both the proxy and the node agent call this through ``inference.chat_request``, so the two can
never disagree on what a valid request is.
"""

from __future__ import annotations

import collections.abc
import types
import typing
from functools import cache
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typing_extensions as te
from openai._types import SequenceNotStr
from openai.types.chat import ChatCompletionMessageParam
from openai.types.chat.completion_create_params import CompletionCreateParamsBase
from pydantic import Field, TypeAdapter, ValidationError

_LISTS = (collections.abc.Iterable, collections.abc.Sequence, list, SequenceNotStr)
_DICTS = (dict, collections.abc.Mapping)
_REQUIRED = (typing.Required, te.Required)
_NOT_REQUIRED = (typing.NotRequired, te.NotRequired)
_DISCRIMINATORS = ("role", "type")


def json_shaped(tp: Any) -> Any:
    """``tp`` with every ``Iterable``/``Sequence``/``SequenceNotStr`` as ``list``, every
    ``TypedDict`` rebuilt the same way, and unions of ``TypedDict`` s that share a required
    ``role`` or ``type`` literal discriminated on it (one clear error instead of one per member).
    """
    if tp is SequenceNotStr:
        return list[Any]
    origin = get_origin(tp)
    args = get_args(tp)
    if origin in _LISTS:
        return list[json_shaped(args[0]) if args else Any]
    if origin in _DICTS:
        return dict[args[0], json_shaped(args[1])] if args else dict[str, Any]
    if origin in _REQUIRED:
        return te.Required[json_shaped(args[0])]
    if origin in _NOT_REQUIRED:
        return te.NotRequired[json_shaped(args[0])]
    if origin is Annotated:
        return Annotated[(json_shaped(args[0]), *tp.__metadata__)]
    if origin in (Union, types.UnionType):
        return _union(tuple(json_shaped(a) for a in args))
    if te.is_typeddict(tp):
        return _typed_dict(tp)
    return tp


@cache
def _typed_dict(td: Any) -> Any:
    return te.TypedDict(td.__name__, _fields(td), total=td.__total__)  # type: ignore[operator]


def _fields(td: Any) -> dict[str, Any]:
    """Each field JSON-shaped; an optional field also takes ``null`` (as absent), as OpenAI's
    API does: clients send back a response's message with ``"tool_calls": null``."""
    hints = typing.get_type_hints(td, include_extras=True)
    fields = {}
    for name, hint in hints.items():
        shaped = json_shaped(hint)
        if not _required(td, name, shaped):
            if get_origin(shaped) in _NOT_REQUIRED:
                shaped = get_args(shaped)[0]
            shaped = shaped | None
        fields[name] = shaped
    return fields


def _required(td: Any, name: str, hint: Any) -> bool:
    """Whether ``td`` requires ``name`` (the SDK's modules use string annotations, so a
    ``Required[...]`` there is seen in the resolved hint, not always in ``__required_keys__``)."""
    if get_origin(hint) in _REQUIRED:
        return True
    return name in td.__required_keys__ and get_origin(hint) not in _NOT_REQUIRED


def _union(members: tuple[Any, ...]) -> Any:
    union = Union[members]  # noqa: UP007 (a runtime-built union)
    key = _common_literal_key(members)
    return Annotated[union, Field(discriminator=key)] if key else union


def _common_literal_key(members: tuple[Any, ...]) -> str | None:
    """The ``role``/``type`` key that every member requires as a distinct ``Literal``."""
    if len(members) < 2 or not all(te.is_typeddict(m) for m in members):
        return None
    for key in _DISCRIMINATORS:
        values: list[Any] = []
        for member in members:
            hint = typing.get_type_hints(member, include_extras=True).get(key)
            if hint is None or not _required(member, key, hint):
                break
            while get_origin(hint) in (*_REQUIRED, Annotated):
                hint = get_args(hint)[0]
            if get_origin(hint) is not Literal:
                break
            values.extend(get_args(hint))
        else:
            if len(values) == len(set(values)):
                return key
    return None


# The SDK splits ``stream`` off into two subclasses (streaming or not); one body type takes both.
ChatBody = te.TypedDict(  # type: ignore[operator]
    "ChatCompletionRequest",
    {**_fields(CompletionCreateParamsBase), "stream": bool | None},
    total=False,
)
ChatMessage = json_shaped(ChatCompletionMessageParam)


@cache
def _body_adapter() -> TypeAdapter[Any]:
    return TypeAdapter(ChatBody)


def schema_problem(body: dict[str, Any]) -> tuple[str, str] | None:
    """Check a decoded JSON body against the OpenAI chat request schema.

    Returns None when it conforms, else ``(field, problem)``: ``field`` in the client's terms
    (``"messages[1].tool_calls"``), ``problem`` a phrase (``"must be a list"``). Costs about
    0.1 ms for a twenty-message body.
    """
    try:
        _body_adapter().validate_python(body, strict=True)
    except ValidationError as exc:
        return describe_errors(exc.errors(include_url=False), body)
    return None


# Error wording ------------------------------------------------------------------------------

_KINDS = {
    "string_type": "a string",
    "list_type": "a list",
    "int_type": "an integer",
    "float_type": "a number",
    "bool_type": "a boolean",
    "dict_type": "an object",
    "typed_dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
    "none_required": "null",
}


def describe_errors(errors: list[Any], body: Any) -> tuple[str, str]:
    """The deepest field an error names (the union member that matched the data's shape goes
    deepest) and a phrase for it; alternatives at that field (a string or a list) are joined
    with "or"."""
    paths = [_client_path(e, body) for e in errors]
    first = max(paths, key=lambda p: p.count(".") + p.count("["))
    phrases = [_phrase(e) for e, path in zip(errors, paths, strict=True) if path == first]
    kinds = [p.removeprefix("must be ") for p in phrases if p.startswith("must be ")]
    if len(kinds) > 1:
        return first, "must be " + " or ".join(dict.fromkeys(kinds))
    return first, phrases[0]


def _phrase(error: Any) -> str:
    kind = error["type"]
    if kind in _KINDS:
        return f"must be {_KINDS[kind]}"
    if kind == "missing":
        return "is required"
    if kind == "literal_error":
        expected = str(error["ctx"]["expected"])
        return f"must be {expected}" if len(expected) <= 120 else "must be one of the known values"
    if kind == "union_tag_invalid":
        return f"must be one of {error['ctx']['expected_tags']}, not {error['ctx']['tag']!r}"
    if kind == "union_tag_not_found":
        return "is required"
    return str(error["msg"]).replace("Input should", "must").replace("Input", "the value")


def _client_path(error: Any, body: Any) -> str:
    """The error's ``loc`` walked against the data: keys and indexes that exist in ``body`` are
    kept, the union labels pydantic adds between them are dropped: a type name, or the tag of
    a discriminated union (the value of the object's ``role`` / ``type``, which comes right
    after the object and may also be one of its keys: a tool call's ``"function"``). A bad or
    missing discriminator names its field (``messages[0].role``)."""
    loc = tuple(error["loc"])
    if error["type"] in ("union_tag_invalid", "union_tag_not_found"):
        loc = (*loc, error["ctx"]["discriminator"].strip("'"))
    missing = error["type"] in ("missing", "union_tag_not_found", "union_tag_invalid")
    path, here, arrived = "", body, True
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if arrived and not last and _is_tag(here, part):
            arrived = False
        elif isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
            path, here, arrived = f"{path}[{part}]", here[part], True
        elif isinstance(here, dict) and part in here:
            path, here, arrived = (f"{path}.{part}" if path else str(part)), here[part], True
        elif missing and last:
            path = f"{path}.{part}" if path else str(part)
        else:
            arrived = False
    return path or "body"


def _is_tag(here: Any, part: Any) -> bool:
    return isinstance(here, dict) and any(
        isinstance(here.get(key), str) and here.get(key) == part for key in _DISCRIMINATORS
    )
