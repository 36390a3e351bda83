"""python -m optloop export: every format from a real MLflow store, standalone modules, bad inputs.

The store is built with real MLflow calls as ``optloop.run`` lays a run out
(``tests/optloop/_export_store.py``). The exported mem0 and graphiti modules are
imported in a fresh interpreter where optloop cannot be imported (``-I -S`` with
only site-packages and the output directory on ``sys.path``) and applied to a
vanilla ``mem0.Memory`` talking to a loopback OpenAI-compatible server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

from optloop.cli.command import run_cli
from optloop.cli.export import main
from optloop.product import response_format
from optloop.product.templates.mem0_prompts import sha256
from optloop.testing.scripted import ScriptedOpenAIServer
from signatures.graphiti import library_system_prompt
from signatures.mem0 import AGENT_CONTEXT_SUFFIX
from tests.optloop._export_store import (
    EDGE_RULE,
    EDGE_SITE,
    MEM0_RULE,
    store,  # noqa: F401 (a fixture)
    template,  # noqa: F401 (a fixture)
)


def export(*args: str) -> int:
    return run_cli(main, list(args))


# --- formats -----------------------------------------------------------------------------------


def test_json_from_a_run_is_every_sites_exact_prompt_with_demos_rendered(store, tmp_path):
    out = tmp_path / "prompts.json"
    assert export("--run", store.runs["mem0"], "--format", "json", "--out", str(out)) == 0
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data == store.texts["mem0"]
    extract = data["mem0.extract"]
    assert MEM0_RULE in extract and "# Examples" in extract and "User drinks green tea" in extract


def test_json_from_a_registry_prompt_by_alias_version_or_uri(store, tmp_path):
    expected = {"mem0.extract": store.texts["mem0"]["mem0.extract"]}
    for i, ref in enumerate(
        [
            "optloop.mem0.extract@champion",
            "prompts:/optloop.mem0.extract@champion",
            "optloop.mem0.extract/1",
            "prompts:/optloop.mem0.extract/1",
        ]
    ):
        out = tmp_path / f"p{i}.json"
        assert export("--prompt", ref, "--format", "json", "--out", str(out)) == 0, ref
        assert json.loads(out.read_text(encoding="utf-8")) == expected
    out = tmp_path / "answer.json"
    assert (
        export("--prompt", "optloop.mem0.answer@champion", "--format", "json", "--out", str(out))
        == 0
    )
    assert json.loads(out.read_text()) == {"answer": store.texts["mem0"]["answer"]}


def test_dspy_is_the_runs_program_json(store, tmp_path):
    import dspy

    from optloop.loop.program import AllSites
    from signatures.mem0 import Mem0Extract

    out = tmp_path / "program.json"
    assert export("--run", store.runs["mem0"], "--format", "dspy", "--out", str(out)) == 0
    assert out.read_text() == store.programs["mem0"]
    program = AllSites({"mem0.extract": dspy.Predict(Mem0Extract)})
    program.load(str(out))
    assert program.mem0__extract.signature.instructions.endswith(MEM0_RULE)
    assert len(program.mem0__extract.demos) == 1


def test_mem0_module_carries_prompts_schemas_knobs_and_provenance(store, tmp_path):
    out = tmp_path / "mem0_prompts.py"
    assert export("--run", store.runs["mem0"], "--format", "mem0", "--out", str(out)) == 0
    text = out.read_text(encoding="utf-8")
    assert "import optloop" not in text and "from optloop" not in text
    namespace: dict = {}
    exec(compile(text, str(out), "exec"), namespace)
    assert namespace["PROMPTS"] == store.texts["mem0"]
    assert namespace["RESPONSE_FORMATS"] == {
        s: response_format(s) for s in ("mem0.extract", "mem0.rerank")
    }
    assert namespace["KNOBS"] == store.knobs["mem0"]
    assert namespace["SOURCE"]["run_id"] == store.runs["mem0"]
    from optloop.product.templates.mem0_prompts import library_prompts

    assert namespace["LIBRARY_SHA256"] == {s: sha256(t) for s, t in library_prompts().items()}


def test_schema_mode_json_object_is_what_a_llama_cpp_endpoint_gets(store, tmp_path):
    out = tmp_path / "mem0_prompts.py"
    assert (
        export(
            "--prompt",
            "optloop.mem0.extract@champion",
            "--format",
            "mem0",
            "--schema-mode",
            "json_object",
            "--out",
            str(out),
        )
        == 0
    )
    namespace: dict = {}
    exec(out.read_text(), namespace)
    fmt = namespace["RESPONSE_FORMATS"]["mem0.extract"]
    assert fmt["type"] == "json_object" and fmt["schema"]["required"] == ["memory"]
    assert list(namespace["PROMPTS"]) == ["mem0.extract"]


def _standalone(
    script: str, out_dir: Path, env_dir: Path, *args: str
) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter that sees only site-packages and ``out_dir`` (no
    optloop)."""
    site_packages = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    prelude = (
        f"import sys; sys.path[:] = {[str(out_dir), *site_packages]!r} + "
        "[p for p in sys.path if 'site-packages' not in p]\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('optloop') is None, 'optloop is importable'\n"
        "assert importlib.util.find_spec('signatures') is None and "
        "importlib.util.find_spec('systems') is None\n"
    )
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(env_dir),
        "MEM0_DIR": str(env_dir / "mem0"),
        "MEM0_TELEMETRY": "False",
        "GRAPHITI_TELEMETRY_ENABLED": "false",
        "HF_HUB_OFFLINE": "1",
    }
    return subprocess.run(
        [sys.executable, "-I", "-S", "-c", prelude + textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=env_dir,
        timeout=300,
    )


VANILLA_MEM0 = """
import json, sys, hashlib
from mem0 import Memory
from mem0.configs.base import MemoryConfig
from mem0.embeddings.base import EmbeddingBase
from mem0.configs.embeddings.base import BaseEmbedderConfig
import mem0_prompts

class HashEmbedding(EmbeddingBase):  # the product's own embedder; any will do here
    def __init__(self):
        super().__init__(BaseEmbedderConfig(embedding_dims=8))
    def embed(self, text, memory_action=None):
        digest = hashlib.sha256(text.encode()).digest()
        return [b / 255 for b in digest[:8]]
    def embed_batch(self, texts, memory_action="add"):
        return [self.embed(t) for t in texts]

base_url, root = sys.argv[-2], sys.argv[-1]
llm = {
    "provider": "openai",
    "config": {"model": "gpt-test", "api_key": "k", "openai_base_url": base_url},
}
memory = Memory(MemoryConfig(
    vector_store={"provider": "qdrant", "config": {"collection_name": "m",
                                                   "embedding_model_dims": 8,
                                                   "path": root + "/qdrant", "on_disk": True}},
    llm=llm, embedder={"provider": "openai", "config": {"api_key": "k",
                                                        "openai_base_url": base_url,
                                                        "embedding_dims": 8}},
    history_db_path=root + "/history.db",
    reranker={"provider": "llm_reranker", "config": {"llm": llm}}))
memory.embedding_model = HashEmbedding()
applied = mem0_prompts.apply(memory)
memory.add([{"role": "user", "content": "I adopted a beagle named Max."}], user_id="u")
memory.add([{"role": "user", "content": "Max loves the park."}], agent_id="a")
found = memory.search("beagle", top_k=5, filters={"user_id": "u"}, rerank=True)["results"]
memory.close()
print(json.dumps({"applied": applied,
                  "found": [[r["memory"], r.get("rerank_score")] for r in found]}))
"""


def test_exported_mem0_module_makes_vanilla_mem0_send_the_optimized_request_without_optloop(
    store, tmp_path
):
    out_dir = tmp_path / "product"
    out_dir.mkdir()
    assert (
        export(
            "--run",
            store.runs["mem0"],
            "--format",
            "mem0",
            "--out",
            str(out_dir / "mem0_prompts.py"),
        )
        == 0
    )
    extraction = json.dumps(
        {
            "memory": [
                {"id": "0", "text": "User adopted a beagle named Max", "attributed_to": "user"}
            ]
        }
    )
    script = [
        ("ok", extraction),
        ("ok", json.dumps({"memory": []})),
        ("ok", json.dumps({"score": 1e-05})),
    ]
    with ScriptedOpenAIServer(script) as server:
        done = _standalone(
            VANILLA_MEM0, out_dir, tmp_path, server.base_url, str(tmp_path / "store")
        )
        assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["applied"] == ["mem0.extract", "mem0.rerank"]
    chats = [r["body"] for r in server.requests if r["path"].endswith("/chat/completions")]
    assert len(chats) == 3
    texts = store.texts["mem0"]
    user_add, agent_add, rerank = chats
    assert user_add["messages"][0] == {"role": "system", "content": texts["mem0.extract"]}
    assert agent_add["messages"][0]["content"] == texts["mem0.extract"] + AGENT_CONTEXT_SUFFIX
    assert (
        user_add["response_format"]
        == agent_add["response_format"]
        == response_format("mem0.extract")
    )
    assert (
        "I adopted a beagle named Max." in user_add["messages"][1]["content"]
    )  # mem0's own user message
    assert rerank["messages"][0]["content"] == texts["mem0.rerank"]
    assert rerank["response_format"] == response_format("mem0.rerank")
    # mem0 stored what the model extracted, and read the {"score": ...} answer as optloop's run
    # does
    assert result["found"] == [["User adopted a beagle named Max", 0.0]]


GRAPHITI_LIBRARY = """
import json
from graphiti_core.prompts.lib import DefaultChatPromptLibrary, get_prompt_builder
import graphiti_prompts

class Probe(dict):  # every key a builder reads exists
    def __missing__(self, key):
        return []

library = graphiti_prompts.prompt_library()
out = {}
for name in ("extract_edges.edge", "extract_nodes.extract_message"):
    ours = get_prompt_builder(library, name)(Probe())
    theirs = get_prompt_builder(DefaultChatPromptLibrary(), name)(Probe())
    out[name] = {"system": ours.system.content,
                 "user_same": ours.user.content == theirs.user.content,
                 "default_system": theirs.system.content,
                 "sent_system": get_prompt_builder(library, name)(Probe())
                 .as_messages()[0].content}
print(json.dumps(out))
"""


def test_exported_graphiti_module_builds_a_library_with_the_optimized_system_text(store, tmp_path):
    out_dir = tmp_path / "product"
    out_dir.mkdir()
    assert (
        export(
            "--run",
            store.runs["graphiti"],
            "--format",
            "graphiti",
            "--out",
            str(out_dir / "graphiti_prompts.py"),
        )
        == 0
    )
    done = _standalone(GRAPHITI_LIBRARY, out_dir, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    edge = result["extract_edges.edge"]
    assert edge["system"] == store.texts["graphiti"][EDGE_SITE] and edge["system"].endswith(
        EDGE_RULE
    )
    assert edge["user_same"] and edge["default_system"] == library_system_prompt(
        "extract_edges.edge"
    )
    assert (
        edge["sent_system"].startswith(edge["system"]) and edge["sent_system"] != edge["system"]
    )  # + framing
    # the run's other graphiti sites are exported unchanged: graphiti's own text
    nodes = result["extract_nodes.extract_message"]
    assert nodes["system"] == nodes["default_system"] and nodes["user_same"]


def test_every_command_the_help_shows_is_one_the_parser_takes():
    """The usage lines at the top of ``--help`` are commands that parse (their source and format as
    shown)."""
    import shlex

    from optloop.cli import export

    commands = [
        shlex.split(line.strip())[4:]
        for line in (export.__doc__ or "").replace("\\\n", " ").splitlines()
        if line.strip().startswith("python -m optloop export ")
    ]
    assert len(commands) >= 5
    for argv in commands:
        args = export.build_parser().parse_args(argv)
        assert args.format in export.FORMATS and (args.run or args.prompt)
        assert args.format == argv[argv.index("--format") + 1]


# --- bad input -----------------------------------------------------------------------------------


def _bad(store, tmp_path) -> list[tuple[list[str], str]]:
    runs = store.runs
    return [
        (["--run", "0123456789abcdef0123456789abcdef", "--format", "json"], "no MLflow run"),
        (["--run", runs["mem0-child"], "--format", "json"], "child run"),
        (["--run", runs["foreign"], "--format", "json"], "not an optloop.run parent run"),
        (["--run", runs["unfinished"], "--format", "json"], "has not finished"),
        (
            ["--run", runs["mem0"], "--format", "graphiti"],
            "--format graphiti needs graphiti prompts",
        ),
        (["--run", runs["graphiti"], "--format", "mem0"], "--format mem0 needs mem0 prompts"),
        (
            ["--prompt", "optloop.graphiti.extract_edges.edge@champion", "--format", "mem0"],
            "needs mem0 prompts",
        ),
        (["--prompt", "optloop.mem0.answer@champion", "--format", "mem0"], "needs mem0 prompts"),
        (
            ["--prompt", "optloop.mem0.extract@champion", "--format", "dspy"],
            "needs a run's DSPy program",
        ),
        (["--prompt", "optloop.mem0.nope@champion", "--format", "json"], "not found"),
        (["--prompt", "optloop.mem0.extract@nope", "--format", "json"], "alias nope not found"),
        (["--prompt", "optloop.mem0.extract/9", "--format", "json"], "not found"),
        (
            ["--prompt", "optloop.mem0.extract", "--format", "json"],
            "write NAME@ALIAS or NAME/VERSION",
        ),
        (
            [
                "--run",
                runs["mem0"],
                "--format",
                "json",
                "--tracking-uri",
                f"sqlite:///{tmp_path / 'none' / 'x.db'}",
            ],
            "no MLflow store",
        ),
    ]


def test_bad_inputs_exit_non_zero_with_one_line_and_write_nothing(store, tmp_path, capsys):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "keep.py").write_text("# the product's previous export\n")
    for args, reason in _bad(store, tmp_path):
        for out in (out_dir / "new.py", out_dir / "keep.py"):
            code = export(*args, "--out", str(out))
            err = capsys.readouterr().err.strip()
            assert code == 2, (args, err)
            assert err.startswith("optloop: error: ") and "\n" not in err and reason in err, (
                args,
                err,
            )
            assert sorted(p.name for p in out_dir.iterdir()) == ["keep.py"], args
            assert (out_dir / "keep.py").read_text() == "# the product's previous export\n"
    assert not (tmp_path / "none").exists()  # a missing store is not created


def test_unwritable_out_paths_are_refused_before_any_work(store, tmp_path, capsys):
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out, reason in [
        (tmp_path, "is a directory"),
        (tmp_path / "missing" / "m.py", "does not exist"),
        (a_file / "m.py", "does not exist"),
    ]:
        assert export("--run", store.runs["mem0"], "--format", "mem0", "--out", str(out)) == 2
        err = capsys.readouterr().err.strip()
        assert reason in err and "\n" not in err, err
    assert not (tmp_path / "missing").exists() and a_file.read_text() == "x"


def test_argument_errors_exit_non_zero():
    done = subprocess.run(
        [sys.executable, "-m", "optloop", "export", "--format", "json", "--out", "x.json"],
        capture_output=True,
        text=True,
    )
    assert (
        done.returncode == 2 and "one of the arguments --run --prompt is required" in done.stderr
    )


# --- any reference, the user's file modes -----------------------------------------------------


def test_a_prompt_reference_ending_in_a_newline_exports_a_module_that_compiles(store, tmp_path):
    out = tmp_path / "mem0_prompts.py"
    ref = "optloop.mem0.extract@champion\n"
    assert export("--prompt", ref, "--format", "mem0", "--out", str(out)) == 0
    text = out.read_text()
    compile(text, str(out), "exec")
    assert text.splitlines()[0].startswith(
        "# Written by `python -m optloop export --prompt "
        "optloop.mem0.extract@champion --format mem0` (prompt "
    )


def test_exported_files_take_the_users_umask_or_keep_an_existing_files_mode(store, tmp_path):
    import os
    import stat

    previous = os.umask(0o022)
    try:
        new = tmp_path / "prompts.json"
        assert export("--run", store.runs["mem0"], "--format", "json", "--out", str(new)) == 0
        assert stat.S_IMODE(new.stat().st_mode) == 0o644  # a service of another user reads it
        os.umask(0o007)
        group = tmp_path / "group.json"
        assert export("--run", store.runs["mem0"], "--format", "json", "--out", str(group)) == 0
        assert stat.S_IMODE(group.stat().st_mode) == 0o660
        new.chmod(0o640)
        assert export("--run", store.runs["mem0"], "--format", "json", "--out", str(new)) == 0
        assert stat.S_IMODE(new.stat().st_mode) == 0o640
    finally:
        os.umask(previous)
