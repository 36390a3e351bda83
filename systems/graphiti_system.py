"""graphiti as an optloop memory system: the real ``graphiti-core``, its LLM calls on prompt sites.

Storage, extraction pipeline and search are graphiti's own. Only its LLM client is replaced:
:class:`SiteLLMClient` receives each ``generate_response`` call, looks up the prompt site named
after its ``prompt_name`` (``graphiti.extract_edges.edge`` ...) and runs that site's DSPy module
on the system's :class:`~optloop.lm.OptloopLM`. The messages it sends are what vanilla graphiti
with ``OpenAIGenericClient`` sends: the prompt builder's system text (the site's instructions),
then graphiti's framing appended exactly where the library appends it, control characters cleaned
the same way, and the builder's user message verbatim.

The graph lives in Kuzu embedded under ``run_dir`` by default; ``graph_uri`` (``bolt://`` /
``neo4j://`` for Neo4j, ``falkor://`` / ``redis://`` for FalkorDB) uses a server instead.
Embeddings and reranking are local, so nothing calls OpenAI unless the LM itself is remote.
graphiti is async: the system owns one event loop on a private thread and exposes the synchronous
:class:`~systems.base.MemorySystem` API over it, the caller's context variables travelling with
each call. Sessions go in order (``ingest`` holds the system's lock); searches take the lock too,
answers do not. How graphiti runs at ``--concurrency N``: ``docs/architecture.md``
("Concurrency").
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import re
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar
from urllib.parse import urlparse

import dspy
import pydantic
from graphiti_core import Graphiti
from graphiti_core.cross_encoder.client import CrossEncoderClient
from graphiti_core.driver.driver import GraphProvider
from graphiti_core.edges import EntityEdge
from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.errors import GroupsEdgesNotFoundError, GroupsNodesNotFoundError
from graphiti_core.graph_queries import get_fulltext_indices
from graphiti_core.llm_client import client as graphiti_llm_client
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig, ModelSize
from graphiti_core.nodes import CommunityNode, EntityNode, EpisodeType, EpisodicNode
from graphiti_core.prompts.models import Message
from graphiti_core.search import search_config_recipes
from graphiti_core.search.search_config import EdgeReranker, NodeReranker, SearchConfig

from optloop.errors import ConfigError, OptloopError
from signatures._layout import LibraryLayoutAdapter, jsonable
from signatures.graphiti import OP_KINDS, SIGNATURES, SITE_PREFIX
from systems.base import MemoryItem, MemorySystem, PromptSite

if TYPE_CHECKING:
    from optloop.datasets import Session
    from optloop.embed import Embedder
    from optloop.lm import OptloopLM

logger = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_GROUP_ID = "optloop"
KUZU_FILE = "graphiti.kuzu"
# Sessions whose timestamp does not parse get consecutive minutes from here: a
# deterministic time keeps prompts (and so the LM cache) stable across runs.
FALLBACK_TIME = datetime(2000, 1, 1, tzinfo=UTC)


class UnknownPromptError(OptloopError):
    """graphiti sent a prompt that has no optloop prompt site."""


# ---------------------------------------------------------------------------
# Search recipes (the ``search_recipe`` knob)
# ---------------------------------------------------------------------------


def _needs_center_node(config: SearchConfig) -> bool:
    return (
        config.edge_config is not None
        and config.edge_config.reranker == EdgeReranker.node_distance
    ) or (
        config.node_config is not None
        and config.node_config.reranker == NodeReranker.node_distance
    )


SEARCH_RECIPES: dict[str, SearchConfig] = {
    name: value
    for name, value in vars(search_config_recipes).items()
    if isinstance(value, SearchConfig) and not _needs_center_node(value)
}
"""graphiti's search recipes by name, less the node-distance ones (they need a center node)."""


def search_recipe(name: str) -> SearchConfig:
    """A fresh copy of the named recipe; a one-line error lists the choices."""
    if name not in SEARCH_RECIPES:
        raise ConfigError(
            f"unknown graphiti search_recipe {name!r}; "
            f"choose one of: {', '.join(sorted(SEARCH_RECIPES))}"
        )
    return SEARCH_RECIPES[name].model_copy(deep=True)


# ---------------------------------------------------------------------------
# The replaced LLM client
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Framing:
    """What graphiti adds around a prompt site's system text on one call."""

    system_suffix: str
    clean: Callable[[str], str]


_FRAMING: contextvars.ContextVar[_Framing | None] = contextvars.ContextVar(
    "graphiti_framing", default=None
)


class GraphitiLayoutAdapter(LibraryLayoutAdapter):
    """The library layout plus graphiti's client-side framing of the system message.

    The site's instructions (+ demos) stand where graphiti's prompt builder puts
    its system text; the framing active for this call follows them, and the
    whole message is cleaned as graphiti cleans it. Outside a graphiti call there
    is no framing and this is :class:`LibraryLayoutAdapter`.
    """

    def format(self, signature, demos, inputs):
        messages = super().format(signature, demos, inputs)
        framing = _FRAMING.get()
        if framing is not None:
            messages[0] = {
                "role": "system",
                "content": framing.clean(messages[0]["content"] + framing.system_suffix),
            }
        return messages


class SiteLLMClient(LLMClient):
    """graphiti's LLM client, replaced: each call runs the prompt site its ``prompt_name`` names.

    ``generate_response`` reproduces what ``OpenAIGenericClient`` (structured
    output via ``json_schema``) does to the messages, then hands the site the
    user message and returns the parsed output fields as the dict graphiti
    expects. ``sites`` is read on every call, so a site whose instructions an
    optimizer changed takes effect at once. graphiti's ``max_tokens`` and
    ``model_size`` are not forwarded: the one :class:`~optloop.lm.OptloopLM`
    decides both (a 16k-token budget does not fit a local context window).
    The site runs on a worker thread of the LM's own pool (``lm.to_thread``: ``max(32, 4 x
    concurrency)`` threads, where asyncio's default pool has 6 on 2 cores), so the event loop keeps
    serving graphiti's concurrent calls while blocking LM calls are in flight, as many as
    ``--concurrency`` allows.
    """

    def __init__(self, lm: OptloopLM, sites: Callable[[], dict[str, PromptSite]]):
        super().__init__(LLMConfig(model=lm.model), cache=False)
        self.lm = lm
        self._sites = sites

    def site_for(self, prompt_name: str | None) -> PromptSite:
        sites = self._sites()
        site = sites.get(SITE_PREFIX + str(prompt_name))
        if site is None:
            known = sorted(
                name.removeprefix(SITE_PREFIX) for name in sites if name.startswith(SITE_PREFIX)
            )
            raise UnknownPromptError(
                f"graphiti sent prompt {prompt_name!r}, which has no optloop prompt site "
                f"(known: {', '.join(known)}); "
                "add a signature for it in signatures/graphiti.py"
            )
        return site

    async def generate_response(
        self,
        messages: list[Message],
        response_model: type[pydantic.BaseModel] | None = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        *,
        attribute_extraction: bool = False,
        model: str | None = None,
    ) -> dict[str, Any]:
        site = self.site_for(prompt_name)
        fields = list(site.module.signature.output_fields)
        if response_model is None or list(response_model.model_fields) != fields:
            raise UnknownPromptError(
                f"graphiti asked {prompt_name} for "
                f"{getattr(response_model, '__name__', None)}, but its site "
                f"answers with fields {fields}; the installed graphiti-core differs from the one "
                "signatures/graphiti.py read"
            )
        if [m.role for m in messages] != ["system", "user"]:
            raise UnknownPromptError(
                f"graphiti prompt {prompt_name} sent roles {[m.role for m in messages]}; "
                "a library-layout site takes exactly one system and one user message"
            )
        # OpenAIGenericClient.generate_response, json_schema mode: preamble, then the language
        # note.
        self._apply_attribute_extraction_preamble(messages, attribute_extraction)
        messages[0].content += graphiti_llm_client.get_extraction_language_instruction(group_id)
        system = messages[0].content
        if not system.startswith(site.seed_instruction):
            raise UnknownPromptError(
                f"graphiti's system message for {prompt_name} does not start with the seeded "
                "prompt text; the installed graphiti-core or its prompt library differs from "
                "the one signatures/graphiti.py read"
            )
        framing = _Framing(
            system_suffix=system[len(site.seed_instruction) :], clean=self._clean_input
        )
        user = self._clean_input(messages[1].content)
        prediction = await self.lm.to_thread(self._run_site, site, user, framing)
        return {name: jsonable(prediction[name]) for name in fields}

    def _run_site(self, site: PromptSite, user: str, framing: _Framing) -> dspy.Prediction:
        token = _FRAMING.set(framing)
        try:
            return site(self.lm, user_content=user)
        finally:
            _FRAMING.reset(token)

    async def _generate_response(
        self,
        messages,
        response_model=None,
        max_tokens=0,
        model_size=ModelSize.medium,
        *,
        model=None,
    ) -> dict[str, Any]:  # pragma: no cover - generate_response is overridden
        raise NotImplementedError("SiteLLMClient answers in generate_response")


# ---------------------------------------------------------------------------
# Local embedder and reranker
# ---------------------------------------------------------------------------


class LocalEmbedderClient(EmbedderClient):
    """graphiti's embedder interface over optloop's :class:`~optloop.embed.Embedder`."""

    def __init__(self, embedder: Embedder):
        self.embedder = embedder

    async def create(
        self, input_data: str | list[str] | Iterable[int] | Iterable[Iterable[int]]
    ) -> list[float]:
        # Like graphiti's OpenAIEmbedder: one text, or a list whose first text is embedded.
        texts: list[Any] = [input_data] if isinstance(input_data, str) else list(input_data)
        if not texts or not isinstance(texts[0], str):
            raise TypeError("LocalEmbedderClient embeds text only (a string or a list of strings)")
        return (await asyncio.to_thread(self.embedder.embed, texts[:1]))[0].tolist()

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        return (await asyncio.to_thread(self.embedder.embed, list(input_data_list))).tolist()


class LocalCrossEncoderClient(CrossEncoderClient):
    """Reranks passages by embedding cosine similarity to the query (no remote model)."""

    def __init__(self, embedder: Embedder):
        self.embedder = embedder

    async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
        if not passages:
            return []
        vectors = await asyncio.to_thread(self.embedder.embed, [query, *passages])
        scores = vectors[1:] @ vectors[0]
        return sorted(
            zip(passages, (float(s) for s in scores)), key=lambda pair: pair[1], reverse=True
        )


# ---------------------------------------------------------------------------
# The event loop the system owns
# ---------------------------------------------------------------------------


CLOSE_TIMEOUT_S = 10.0


async def _cancel_pending() -> None:
    """Cancel every other task of the running loop and wait until each has ended."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _LoopThread:
    """One asyncio loop on a daemon thread; ``run`` blocks the caller until a coroutine is done.

    ``run_coroutine_threadsafe`` schedules in a copy of the caller's context, so
    DSPy settings and optloop's accounting reach the coroutine.
    """

    def __init__(self, name: str):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self.thread:
            coro.close()
            raise RuntimeError("GraphitiSystem was called from inside its own event loop")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            # Interrupted while waiting (Ctrl-C, SIGTERM): cancel the coroutine rather than
            # leave it pending in the loop.
            future.cancel()
            raise

    def close(self) -> None:
        """Cancel what is still pending (an interrupted ingest), then stop and close the loop, so
        no task is destroyed pending at exit."""
        if self.loop.is_closed():
            return
        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(_cancel_pending(), self.loop).result(
                    timeout=CLOSE_TIMEOUT_S
                )
            except Exception:  # noqa: BLE001 - a task that ignores cancellation: stop anyway
                logger.debug("graphiti: pending tasks not cancelled in time", exc_info=True)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=CLOSE_TIMEOUT_S)
        if not self.thread.is_alive():
            self.loop.close()


# ---------------------------------------------------------------------------
# The system
# ---------------------------------------------------------------------------


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value is not None else None


def parse_session_time(timestamp: str | None) -> datetime | None:
    """The session's own timestamp as an aware datetime (UTC when it names no zone), or
    ``None``."""
    if not timestamp:
        return None
    try:
        parsed = datetime.fromisoformat(timestamp)
    except ValueError:
        from dateutil import parser as date_parser  # LoCoMo-style "1:56 pm on 8 May, 2023"

        try:
            parsed = date_parser.parse(timestamp, fuzzy=True)
        except (ValueError, OverflowError):
            return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


_NEO4J_SCHEMES = {"bolt", "bolt+s", "bolt+ssc", "neo4j", "neo4j+s", "neo4j+ssc"}
_FALKOR_SCHEMES = {"falkor", "falkordb", "redis"}


def graph_backend(graph_uri: str | None) -> str:
    """Which graph database a URI names: ``kuzu`` (none given), ``neo4j`` or ``falkordb``."""
    if graph_uri is None:
        return "kuzu"
    scheme = urlparse(graph_uri).scheme
    if scheme in _NEO4J_SCHEMES:
        return "neo4j"
    if scheme in _FALKOR_SCHEMES:
        return "falkordb"
    raise ConfigError(
        f"unsupported graph URI {graph_uri!r}; use bolt:// or neo4j:// (Neo4j), "
        "falkor:// or redis:// (FalkorDB), or none for Kuzu embedded under the run directory"
    )


_FTS_INDEX = re.compile(r"CREATE_FTS_INDEX\('(\w+)',\s*'(\w+)'")


async def _build_kuzu_indexes(driver: Any) -> None:
    """graphiti's full-text indexes on a Kuzu store, those it lacks.

    ``KuzuDriver.build_indices_and_constraints`` is a no-op, and without these indexes search
    fails (ENVIRONMENT.md), so they are built here from graphiti's own list. A store opened again
    (a resumed run's, an ``--estimate``'s baseline stores) already has them, and Kuzu refuses to
    create an index twice.
    """
    rows, _, _ = await driver.execute_query("CALL SHOW_INDEXES() RETURN *")
    have = {(row["table_name"], row["index_name"]) for row in rows}
    for query in get_fulltext_indices(GraphProvider.KUZU):
        match = _FTS_INDEX.search(query)
        if match is None or (match.group(1), match.group(2)) not in have:
            await driver.execute_query(query)


def episode_body(session: Session) -> str:
    """The session as graphiti's message episode: one ``speaker: content`` line per turn.

    The speaker is the turn's named speaker when the dataset has one (LoCoMo),
    else its role; graphiti's extraction treats the part before the colon as the
    speaker entity.
    """
    return "\n".join(f"{turn.speaker or turn.role}: {turn.content}" for turn in session.turns)


class GraphitiSystem(MemorySystem):
    """Real ``graphiti-core``: one ``add_episode`` per session, graphiti search for retrieval.

    Knobs: ``search_recipe`` (a name in ``graphiti_core.search.search_config_recipes``,
    see :data:`SEARCH_RECIPES`) and ``top_k`` (alias ``num_results``), graphiti's
    ``SearchConfig.limit``: each layer the recipe searches (edges, nodes,
    episodes, communities) returns up to that many results.

    The default recipe, ``COMBINED_HYBRID_SEARCH_RRF``, searches the facts, the entities and the
    episodes they came from. With the facts alone (``EDGE_HYBRID_SEARCH_RRF``) the embedded
    135M model answers none of the default dataset's dev questions: its extraction keeps
    almost no fact (``experiments/results/defaults.md``).
    """

    name: ClassVar[str] = "graphiti"
    default_knobs: ClassVar[dict[str, Any]] = {
        "top_k": 10,
        "search_recipe": "COMBINED_HYBRID_SEARCH_RRF",
    }
    knob_values: ClassVar[Mapping[str, Sequence[Any]]] = {
        **MemorySystem.knob_values,
        "search_recipe": tuple(
            sorted(n for n in SEARCH_RECIPES if n.startswith(("EDGE_", "COMBINED_")))
        ),
    }
    search_knob: ClassVar[str | None] = "search_recipe"
    knob_aliases: ClassVar[dict[str, str]] = {"num_results": "top_k"}
    # graphiti's response models nest lists of objects of strings; at the LM defaults (16 items
    # of 400 chars) llama.cpp's grammar sampling made one extraction call run over ten minutes.
    local_decoding: ClassVar[dict[str, int]] = {"max_array_items": 3, "max_string_chars": 80}

    def __init__(
        self,
        lm: OptloopLM,
        run_dir: Path,
        *,
        embedder: Embedder | None = None,
        knobs: dict[str, Any] | None = None,
        query_site: bool = False,
        graph_uri: str | None = None,
        graph_user: str | None = None,
        graph_password: str | None = None,
        group_id: str | None = None,
    ):
        super().__init__(
            lm,
            run_dir,
            embedder=embedder,
            knobs=self._canonical_knobs(knobs),
            query_site=query_site,
        )
        search_recipe(self._knobs["search_recipe"])  # fail now, not at the first retrieve
        self.backend = graph_backend(graph_uri)
        self.graph_uri = graph_uri
        self._graph_auth = (graph_user, graph_password)
        # A server is shared by every run; a group per run directory keeps runs apart there.
        digest = hashlib.sha256(str(self.run_dir.resolve()).encode()).hexdigest()[:12]
        self.group_id = group_id or (
            DEFAULT_GROUP_ID if self.backend == "kuzu" else f"{DEFAULT_GROUP_ID}-{digest}"
        )
        self._lock = threading.RLock()
        self._sessions_by_episode: dict[str, str] = {}
        self._fallback_count = 0
        self._loop = _LoopThread(name=f"graphiti-{digest}")
        self._finalizer = weakref.finalize(self, self._loop.close)
        self._graphiti: Graphiti | None = None
        self._loop.run(self._open())

    # --- sites and knobs ----------------------------------------------------------------

    def _build_sites(self) -> None:
        for site_name, signature in SIGNATURES.items():
            self._sites[site_name] = PromptSite(
                name=site_name,
                stage="ingest",
                module=dspy.Predict(signature),
                seed_instruction=signature.instructions,
                op_kinds=OP_KINDS[site_name],
                layout="library",
                _adapter=GraphitiLayoutAdapter(),
            )

    @classmethod
    def _canonical_knobs(cls, knobs: dict[str, Any] | None) -> dict[str, Any] | None:
        if not knobs:
            return knobs
        out: dict[str, Any] = {}
        for name, value in knobs.items():
            canonical = cls.knob_aliases.get(name, name)
            if canonical in out and out[canonical] != value:
                raise ConfigError(
                    f"graphiti knobs {name!r} and {canonical!r} are the same knob; give one "
                    "of them"
                )
            out[canonical] = value
        return out

    def set_knob(self, name: str, value: Any) -> None:
        name = self.knob_aliases.get(name, name)
        if name == "search_recipe":
            search_recipe(value)
        super().set_knob(name, value)

    # --- the store ------------------------------------------------------------------------

    def _make_driver(self) -> Any:
        if self.backend == "kuzu":
            from graphiti_core.driver.kuzu_driver import KuzuDriver

            driver = KuzuDriver(db=str(self.run_dir / KUZU_FILE))
            # graphiti-core 0.31.1 + Kuzu (ENVIRONMENT.md): add_episode(group_id=...) reads
            # driver._database, which KuzuDriver never sets.
            driver._database = "default"
            return driver
        user, password = self._graph_auth
        if self.backend == "neo4j":
            from graphiti_core.driver.neo4j_driver import Neo4jDriver

            return Neo4jDriver(str(self.graph_uri), user, password)
        from graphiti_core.driver.falkordb_driver import FalkorDriver

        parsed = urlparse(str(self.graph_uri))
        return FalkorDriver(
            host=parsed.hostname or "localhost",
            port=parsed.port or 6379,
            username=user or parsed.username,
            password=password or parsed.password,
        )

    def _group_driver(self) -> Any:
        """The driver for this system's group (FalkorDB keeps one graph per group; others share
        one)."""
        return self.graphiti.driver.clone(database=self.group_id)

    async def _open(self) -> None:
        driver = self._make_driver()
        if self.backend == "kuzu":
            await _build_kuzu_indexes(driver)
        self._graphiti = Graphiti(
            graph_driver=driver,
            llm_client=SiteLLMClient(self.lm, lambda: self._sites),
            embedder=LocalEmbedderClient(self.embedder),
            cross_encoder=LocalCrossEncoderClient(self.embedder),
        )
        if self.backend != "kuzu":
            await self._graphiti.build_indices_and_constraints()

    async def _close_store(self) -> None:
        if self._graphiti is None:
            return
        driver: Any = self._graphiti.driver  # a KuzuDriver when backend is kuzu
        await self._graphiti.close()
        # KuzuDriver.close leaves the files open; reset must delete them
        if self.backend == "kuzu":
            driver.client.close()
            driver.db.close()
        self._graphiti = None

    @property
    def graphiti(self) -> Graphiti:
        """The live ``graphiti_core.Graphiti`` (for inspection; use the system's methods to change
        it)."""
        if self._graphiti is None:
            raise RuntimeError("this GraphitiSystem is closed")
        return self._graphiti

    def close(self) -> None:
        """Release the graph store and stop the event loop; the system is unusable afterwards."""
        with self._lock:
            if self._loop.loop.is_closed():
                return
            self._loop.run(self._close_store())
            self._finalizer()

    # --- MemorySystem ---------------------------------------------------------------------

    def reset(self) -> None:
        with self._lock:
            # a server outlives the run directory: delete this group's data
            if self.backend != "kuzu":
                from graphiti_core.utils.maintenance.graph_data_operations import clear_data

                self._loop.run(clear_data(self._group_driver(), group_ids=[self.group_id]))
            self._loop.run(self._close_store())
            self._clear_run_dir()
            self._sessions_by_episode.clear()
            self._fallback_count = 0
            self._loop.run(self._open())

    def ingest(self, sessions: Sequence[Session]) -> None:
        # graphiti requires episodes to be added one after another.
        with self._lock:
            for session in sessions:
                self._loop.run(self._add_session(session))

    async def _add_session(self, session: Session) -> None:
        reference_time = parse_session_time(session.timestamp)
        if reference_time is None:
            reference_time = FALLBACK_TIME + timedelta(minutes=self._fallback_count)
            self._fallback_count += 1
            if session.timestamp:
                logger.warning(
                    "session %s: timestamp %r does not parse; using %s",
                    session.id,
                    session.timestamp,
                    reference_time.isoformat(),
                )
        result = await self.graphiti.add_episode(
            name=session.id,
            episode_body=episode_body(session),
            source_description=f"{session.kind} session {session.id}",
            reference_time=reference_time,
            source=EpisodeType.message,
            group_id=self.group_id,
        )
        self._sessions_by_episode[result.episode.uuid] = session.id

    def search(self, query: str, k: int) -> list[MemoryItem]:
        config = search_recipe(self._knobs["search_recipe"])
        config.limit = k
        with self._lock:
            results = self._loop.run(
                self.graphiti.search_(query, config=config, group_ids=[self.group_id])
            )
            sessions = self._session_ids(
                [uuid for edge in results.edges for uuid in edge.episodes]
            )
        items = [
            self._edge_item(edge, score, sessions)
            for edge, score in _scored(results.edges, results.edge_reranker_scores)
        ]
        items += [
            self._node_item(node, score)
            for node, score in _scored(results.nodes, results.node_reranker_scores)
        ]
        items += [
            self._episode_item(episode, score)
            for episode, score in _scored(results.episodes, results.episode_reranker_scores)
        ]
        items += [
            self._community_item(community, score)
            for community, score in _scored(results.communities, results.community_reranker_scores)
        ]
        return items

    def retrievable_kinds(self) -> set[str] | None:
        config = search_recipe(self._knobs["search_recipe"])
        kinds = {
            "edge": config.edge_config,
            "node": config.node_config,
            "episode": config.episode_config,
            "community": config.community_config,
        }
        return {kind for kind, part in kinds.items() if part is not None}

    def all_memories(self) -> list[MemoryItem]:
        """Every entity edge (fact), expired ones included, every entity node, then every episode
        of the group (a recipe that searches episodes returns them)."""
        with self._lock:
            edges, nodes = self._loop.run(self._all_edges_and_nodes())
            sessions = self._session_ids([uuid for edge in edges for uuid in edge.episodes])
            episodes = self._loop.run(self._all_episodes())
        return (
            [self._edge_item(edge, None, sessions) for edge in edges]
            + [self._node_item(n, None) for n in nodes]
            + [self._episode_item(e, None) for e in episodes]
        )

    async def _all_episodes(self) -> list[EpisodicNode]:
        episodes = await EpisodicNode.get_by_group_ids(self._group_driver(), [self.group_id])
        return sorted(episodes, key=lambda e: (e.created_at, e.uuid))

    async def _all_edges_and_nodes(self) -> tuple[list[EntityEdge], list[EntityNode]]:
        driver = self._group_driver()
        try:
            edges = await EntityEdge.get_by_group_ids(driver, [self.group_id])
        except GroupsEdgesNotFoundError:
            edges = []
        try:
            nodes = await EntityNode.get_by_group_ids(driver, [self.group_id])
        except GroupsNodesNotFoundError:
            nodes = []
        return sorted(edges, key=lambda e: (e.created_at, e.uuid)), sorted(
            nodes, key=lambda n: (n.created_at, n.uuid)
        )

    def _session_ids(self, episode_uuids: Iterable[str]) -> dict[str, str]:
        """Episode uuid -> session id, read back from the store for episodes this object did not
        add."""
        if any(uuid not in self._sessions_by_episode for uuid in episode_uuids):
            episodes = self._loop.run(
                EpisodicNode.get_by_group_ids(self._group_driver(), [self.group_id])
            )
            self._sessions_by_episode.update({episode.uuid: episode.name for episode in episodes})
        return self._sessions_by_episode

    # --- graphiti objects -> MemoryItem ----------------------------------------------------

    @staticmethod
    def _edge_item(edge: EntityEdge, score: float | None, sessions: dict[str, str]) -> MemoryItem:
        when = edge.valid_at or edge.reference_time
        return MemoryItem(
            id=edge.uuid,
            text=edge.fact,
            score=score,
            metadata={
                "kind": "edge",
                "relation": edge.name,
                "source_node_uuid": edge.source_node_uuid,
                "target_node_uuid": edge.target_node_uuid,
                "valid_at": _iso(edge.valid_at),
                "invalid_at": _iso(edge.invalid_at),
                "expired_at": _iso(edge.expired_at),
                "created_at": _iso(edge.created_at),
                "reference_time": _iso(edge.reference_time),
                "timestamp": _iso(when),
                "episodes": list(edge.episodes),
                "session_ids": [sessions[uuid] for uuid in edge.episodes if uuid in sessions],
                "attributes": dict(edge.attributes or {}),
            },
        )

    @staticmethod
    def _node_item(node: EntityNode, score: float | None) -> MemoryItem:
        return MemoryItem(
            id=node.uuid,
            text=f"{node.name}: {node.summary}" if node.summary else node.name,
            score=score,
            metadata={
                "kind": "node",
                "name": node.name,
                "labels": list(node.labels),
                "summary": node.summary,
                "created_at": _iso(node.created_at),
                "attributes": dict(node.attributes or {}),
            },
        )

    @staticmethod
    def _episode_item(episode: EpisodicNode, score: float | None) -> MemoryItem:
        return MemoryItem(
            id=episode.uuid,
            text=episode.content,
            score=score,
            metadata={
                "kind": "episode",
                "session_ids": [episode.name],
                "valid_at": _iso(episode.valid_at),
                "timestamp": _iso(episode.valid_at),
                "created_at": _iso(episode.created_at),
            },
        )

    @staticmethod
    def _community_item(community: CommunityNode, score: float | None) -> MemoryItem:
        return MemoryItem(
            id=community.uuid,
            text=f"{community.name}: {community.summary}",
            score=score,
            metadata={
                "kind": "community",
                "name": community.name,
                "created_at": _iso(community.created_at),
            },
        )


def _scored(objects: Sequence[T], scores: Sequence[float]) -> list[tuple[T, float | None]]:
    return [(obj, float(scores[i]) if i < len(scores) else None) for i, obj in enumerate(objects)]
