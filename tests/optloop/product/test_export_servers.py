"""The exported mem0 module on a server that takes only llama.cpp's ``json_object`` form: the first
refusal of ``json_schema`` switches every route to the same schema as ``json_object``, and the
routed calls carry the run's sampling. (The real server:
``tests/systems/test_library_apps.py``.)"""

from __future__ import annotations

import importlib.util
import json

from optloop.product import loop_sampling, response_format
from optloop.product.export import Bundle, render
from optloop.testing.scripted import ScriptedOpenAIServer
from signatures.mem0 import Mem0Extract  # first: it points MEM0_DIR into optloop's state
from tests.optloop.product.test_product import EXTRACTION, chats, vanilla_memory


def exported(tmp_path, prompt: str):
    bundle = Bundle(
        system="mem0",
        prompts={"mem0.extract": prompt},
        source={"test": True},
        label="a test export",
    )
    path = tmp_path / "mem0_prompts.py"
    path.write_text(render(bundle, "mem0"))
    spec = importlib.util.spec_from_file_location("mem0_prompts_servers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_refused_json_schema_falls_back_to_json_object_with_the_same_schema_and_sampling(
    tmp_path, monkeypatch
):
    monkeypatch.delenv("OPENROUTER_API_KEY", raising=False)
    text = f"{Mem0Extract.instructions}\n\nRule: one memory per fact."
    module = exported(tmp_path, text)
    assert module.SAMPLING == loop_sampling() == {"temperature": 0.0, "max_tokens": 512, "seed": 0}
    with ScriptedOpenAIServer(
        [("ok", EXTRACTION)], schema_modes=frozenset({"json_object", "none"})
    ) as server:
        memory = vanilla_memory(tmp_path, server.base_url)
        memory.llm.client = memory.llm.client.with_options(
            max_retries=0
        )  # the SDK's own retries aside
        module.apply(memory)
        memory.add([{"role": "user", "content": "I adopted a beagle named Max."}], user_id="u")
        memory.add([{"role": "user", "content": "Max is two years old."}], user_id="u")
        stored = memory.get_all(filters={"user_id": "u"})["results"]
        memory.close()
    sent = chats(
        server
    )  # the refused request is not recorded by the scripted server: only what it answered
    assert [body["response_format"] for body in sent] == [
        response_format("mem0.extract", "json_object")
    ] * 2
    assert all(body["messages"][0]["content"] == text for body in sent)
    assert all(
        {k: body[k] for k in ("temperature", "max_tokens", "seed")} == module.SAMPLING
        for body in sent
    )
    assert [m["memory"] for m in stored] == [json.loads(EXTRACTION)["memory"][0]["text"]]
