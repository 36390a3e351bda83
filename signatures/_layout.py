"""The library-layout adapter: a prompt site's call rendered exactly as its library sends it.

A site's signature has one input field, ``user_content`` (the user message the
library builds, verbatim), its instructions are the library's system prompt,
and its output fields are the library's response schema. This adapter renders:

- system message = ``signature.instructions`` plus, when the optimizer added
  demos, a rendered "Examples" section;
- user message = ``inputs["user_content"]``, byte for byte;
- ``response_format`` = the output fields as a JSON schema, so the embedded LM
  decodes under it;

and parses the JSON answer back into the output fields. What an optimizer tunes
(instructions and demos) is therefore exactly what the library would send, and
exporting the instructions string into vanilla mem0/graphiti reproduces the
same messages.
"""

from __future__ import annotations

import json
from typing import Any

import dspy
import pydantic
from dspy.adapters.base import Adapter
from dspy.utils.exceptions import AdapterParseError

USER_FIELD = "user_content"


def output_model(signature: type[dspy.Signature]) -> type[pydantic.BaseModel]:
    """The signature's output fields as one pydantic model (the response schema)."""
    fields = {name: (field.annotation, ...) for name, field in signature.output_fields.items()}
    return pydantic.create_model(  # type: ignore[call-overload]
        f"{signature.__name__}Output", **fields
    )


def render_system(signature: type[dspy.Signature], demos: list[dict[str, Any]]) -> str:
    """System message: the instructions, then any demos as input/output examples."""
    text = signature.instructions
    if not demos:
        return text
    lines = [text, "", "# Examples"]
    for i, demo in enumerate(demos, 1):
        output = {name: jsonable(demo[name]) for name in signature.output_fields if name in demo}
        lines += [
            f"## Example {i}",
            "Input:",
            str(demo.get(USER_FIELD, "")),
            "Output:",
            json.dumps(output, ensure_ascii=False),
        ]
    return "\n".join(lines)


def jsonable(value: Any) -> Any:
    """Pydantic models (also inside lists) as plain JSON-ready data."""
    if isinstance(value, pydantic.BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, list):
        return [jsonable(v) for v in value]
    return value


class LibraryLayoutAdapter(Adapter):
    """Render (system = instructions [+ demos], user = library content) and parse JSON."""

    def __call__(self, lm, lm_kwargs, signature, demos, inputs):
        lm_kwargs = {**lm_kwargs, "response_format": output_model(signature)}
        return super().__call__(lm, lm_kwargs, signature, demos, inputs)

    async def acall(self, lm, lm_kwargs, signature, demos, inputs):
        lm_kwargs = {**lm_kwargs, "response_format": output_model(signature)}
        return await super().acall(lm, lm_kwargs, signature, demos, inputs)

    def format(self, signature, demos, inputs):
        if USER_FIELD not in inputs:
            raise ValueError(
                f"a library-layout site needs its '{USER_FIELD}' input; got {sorted(inputs)}"
            )
        return [
            {"role": "system", "content": render_system(signature, demos)},
            {"role": "user", "content": inputs[USER_FIELD]},
        ]

    def parse(self, signature, completion):
        try:
            data = output_model(signature).model_validate_json(completion)
        except pydantic.ValidationError as exc:
            raise AdapterParseError(
                adapter_name=type(self).__name__,
                signature=signature,
                lm_response=completion,
                message=str(exc),
            ) from exc
        return {name: getattr(data, name) for name in signature.output_fields}
