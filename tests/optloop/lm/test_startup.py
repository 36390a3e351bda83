"""An endpoint checked at startup: unreachable is exit 75 with no cache file left behind;
a corrupt cache still fails when the LM is built, before anything runs.
(``tests/optloop/loop/test_run_cli.py`` runs the same through ``python -m optloop.run``.)"""

from __future__ import annotations

import pytest

from optloop.errors import ConfigError, LMError, LMUnreachableError
from optloop.lm import LMSettings, OptloopLM
from optloop.testing.loopback import closed_port_url
from optloop.testing.scripted import ScriptedOpenAIServer


def test_an_unreachable_endpoint_fails_the_check_with_exit_75_and_writes_no_cache(isolated_state):
    lm = OptloopLM(LMSettings.from_spec("openai:m", base_url=closed_port_url(), max_retries=0))
    with pytest.raises(LMUnreachableError, match="cannot reach") as info:
        lm.check_endpoint()
    assert info.value.exit_code == 75
    assert (
        not (isolated_state / "lm_cache.sqlite").exists()
        and lm.settings.resolved_cache_path().parent.is_dir()
    )


def test_a_reachable_endpoint_passes_and_the_cache_appears_on_the_first_cached_call(
    isolated_state,
):
    with ScriptedOpenAIServer([("ok", "pong")]) as server:
        lm = OptloopLM(LMSettings.from_spec("openai:m", base_url=server.base_url))
        lm.check_endpoint()
        assert not (isolated_state / "lm_cache.sqlite").exists()  # the probe is never cached
        lm.text("q")
    assert (isolated_state / "lm_cache.sqlite").exists() and len(server.requests) == 2


def test_a_rejected_key_is_bad_input_not_an_outage():
    with ScriptedOpenAIServer([("status", 401)]) as server:
        lm = OptloopLM(LMSettings.from_spec("openai:m", base_url=server.base_url))
        with pytest.raises(LMError, match="rejected the API key") as info:
            lm.check_endpoint()
    assert not isinstance(info.value, LMUnreachableError) and info.value.exit_code == 2


def test_a_corrupt_cache_fails_when_the_lm_is_built(tmp_path):
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(ConfigError, match="is corrupt"):
        OptloopLM(LMSettings.from_spec("openai:m", base_url=closed_port_url(), cache_path=path))


def test_the_embedded_model_needs_no_check(tmp_path):
    model = tmp_path / "fake.gguf"
    model.write_bytes(b"gguf")
    lm = OptloopLM(LMSettings.from_spec(f"local:{model}"))
    lm.check_endpoint()  # does not load the model
    assert not lm.backend.loaded
