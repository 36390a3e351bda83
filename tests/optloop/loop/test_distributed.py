"""Several ``optloop.run`` workers on one Optuna study (``docs/architecture.md``, "Several
workers").

The unit tests drive the shared-study protocol (``optloop.loop.workers.study``) and the
Optuna optimizer on a SQLite storage with several connections at once, no LM.
The integration test starts a real PostgreSQL server on loopback from the OS
packages and runs two real workers against one study.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from optloop.errors import ConfigError
from optloop.loop.candidate import Candidate, SiteState
from optloop.loop.optimizers.optuna import OptunaOptimizer
from optloop.loop.workers.study import SharedStudy, redact_url, storage_url
from optloop.testing.oracle import DATASET, PLANTED, OracleEndpoint
from systems import get_system

REPO = Path(__file__).resolve().parents[3]
SECRET = "pg-secret-7f3a"


def open_study(url: str, worker: str, budget: int = 3, **kwargs) -> SharedStudy:
    study = SharedStudy(url, "shared", worker=worker, budget=budget, **kwargs)
    study.join("settings-1")
    return study


@pytest.fixture
def sqlite_url(tmp_path):
    return f"sqlite:///{tmp_path / 'optuna.db'}"


@pytest.fixture
def workers(sqlite_url):
    opened: list[SharedStudy] = []

    def make(worker: str, **kwargs) -> SharedStudy:
        opened.append(open_study(sqlite_url, worker, **kwargs))
        return opened[-1]

    yield make
    for study in opened:
        study.close()


def in_threads(fn, args):
    results, errors = {}, []

    def run(a):
        try:
            results[a] = fn(a)
        except Exception as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(a,)) for a in args]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return results


def test_claim_is_first_writer_wins_across_connections(workers):
    studies = [workers(f"w{i}") for i in range(4)]
    won = in_threads(lambda i: studies[i].claim("optloop:test", {"by": i}), range(4))
    assert len({json.dumps(v) for v in won.values()}) == 1  # every worker read the same winner
    assert studies[0].get("optloop:test") == won[0]
    assert (
        sorted(s.rank for s in studies) == [0, 1, 2, 3]
        and [s.leader for s in studies].count(True) == 1
    )


def test_concurrent_workers_split_the_budget_exactly(workers):
    studies = [workers(f"w{i}", budget=5) for i in range(3)]

    def work(i):
        taken = []
        while studies[i].can_take():
            slot = studies[i].take_slot(f"cand-{i}-{len(taken)}", None)
            if slot is None:
                break
            taken.append(slot)
            studies[i].publish_done(
                slot, {"trial": slot + 1, "accuracy": 0.1 * slot, "candidate": {}}
            )
        studies[i].leave()
        return taken

    taken = in_threads(work, range(3))
    slots = sorted(s for t in taken.values() for s in t)
    assert slots == [0, 1, 2, 3, 4]  # each slot once, never beyond the budget
    assert set(studies[0].done()) == set(range(5)) and studies[1].settled() == (True, [])
    finishers = in_threads(
        lambda i: studies[i].claim("optloop:finisher", studies[i].worker), range(3)
    )
    assert len(set(finishers.values())) == 1


def test_run_settles_only_when_every_worker_is_out(workers):
    a, b = workers("a"), workers("b")
    slot = a.take_slot("x", None)
    assert slot == 0 and a.settled() == (False, ["a"])  # a's evaluation is running
    a.publish_done(slot, {"trial": 1, "accuracy": 0.5, "candidate": {}})
    a.leave()
    assert a.settled() == (False, ["b"])  # b may still take the 2 slots left
    b.leave()
    assert a.settled() == (True, [])
    assert a.best_accuracy(0.25) == 0.5


def test_a_claimed_budget_waits_for_a_worker_still_in_its_loop_so_its_cost_is_counted(workers):
    a, b = workers("a", budget=1), workers("b", budget=1)
    a.publish_done(a.take_slot("x", None), {"trial": 1, "accuracy": 0.5, "candidate": {}})
    a.leave()
    assert a.settled() == (False, ["b"])  # b claims nothing more, but its cost is not in yet
    b.put_cost({"llm_calls": 2, "processes": 1})
    b.leave()
    assert a.settled() == (True, []) and a.others_cost() == {"llm_calls": 2, "processes": 1}


def test_a_restarted_worker_takes_its_unfinished_slot_back(sqlite_url, workers):
    first = open_study(sqlite_url, "a")
    assert first.take_slot("x", None) == 0
    first.close()  # killed during its evaluation
    other = workers("b")
    assert other.take_slot("y", None) == 1
    again = workers("a")
    assert again.rank == 0 and again.my_open_slots() == [0]
    assert (
        again.take_slot("z", None) == 0
    )  # the same slot, not a new one: the budget is counted once
    assert again.take_slot("w", None) == 2 and again.take_slot("v", None) is None


def test_a_worker_with_other_settings_is_refused(sqlite_url, workers):
    workers("a")
    other = SharedStudy(sqlite_url, "shared", worker="b", budget=3)
    with pytest.raises(ConfigError, match="other settings"):
        other.join("settings-2")
    other.close()


def test_a_silent_worker_is_seen_dead(workers):
    a = workers("a", stale_after=0.3)
    b = workers("b")
    assert a.alive("b")
    b.close()  # its heartbeat stops
    time.sleep(0.5)
    assert not a.alive("b") and a.alive("a")


def test_records_live_in_optloops_own_table_not_optunas_private_models(sqlite_url, workers):
    import inspect

    import sqlalchemy

    from optloop.loop.workers import study as study_module

    assert "optuna.storages._" not in inspect.getsource(
        study_module
    )  # Optuna's private storage models are not used
    a = workers("a")
    assert a.claim("optloop:test", {"v": 1}) == {"v": 1} and a.claim("optloop:test", {"v": 2}) == {
        "v": 1
    }
    engine = sqlalchemy.create_engine(sqlite_url)
    with engine.connect() as conn:
        rows = dict(
            conn.execute(
                sqlalchemy.text(
                    "SELECT key, value_json FROM optloop_study_records WHERE key = 'optloop:test'"
                )
            ).fetchall()
        )
    engine.dispose()
    assert json.loads(rows["optloop:test"]) == {"v": 1}
    assert (
        "optloop:test" not in a.study.user_attrs
    )  # nothing in Optuna's own (last-writer-wins) attributes


def test_records_an_older_optloop_kept_in_study_user_attrs_are_adopted(sqlite_url):
    import optuna

    old = optuna.create_study(study_name="shared", storage=sqlite_url, direction="maximize")
    old.set_user_attr("optloop:config", "settings-1")
    old.set_user_attr("optloop:worker:0", "a")
    old.set_user_attr("instructions:answer", ["seed answer", "rewrite"])
    old.set_user_attr("unrelated", 1)
    study = SharedStudy(sqlite_url, "shared", worker="a", budget=3)
    try:
        assert study.get("optloop:config") == "settings-1" and study.get(
            "instructions:answer"
        ) == ["seed answer", "rewrite"]
        assert study.get("unrelated") is None
        assert study.join("settings-1") == 0  # the same worker keeps its rank: rank 0, the leader
        assert study.join("settings-1") == 0
    finally:
        study.close()
    with pytest.raises(
        ConfigError, match="other settings"
    ):  # the adopted config digest still guards the study
        other = SharedStudy(sqlite_url, "shared", worker="b", budget=3)
        try:
            other.join("settings-2")
        finally:
            other.close()


def test_passwords_are_masked():
    assert redact_url("postgresql://me:secret@db:5432/x") == "postgresql://me:***@db:5432/x"
    assert redact_url(None) is None


def test_a_bare_postgresql_url_gets_an_installed_driver():
    pytest.importorskip("psycopg2", reason="psycopg2 is missing: pip install psycopg2-binary")
    assert storage_url("postgresql://u@h/db").startswith(
        ("postgresql+psycopg://", "postgresql+psycopg2://")
    )
    assert storage_url("postgres://u@h/db").endswith("://u@h/db")
    assert storage_url("sqlite:///x.db") == "sqlite:///x.db"


def test_workers_on_one_machine_get_their_own_state_dir(tmp_path):
    from optloop.loop.runs.runner import Loop, LoopConfig

    def loop(optimizer):
        return Loop(
            LoopConfig(system="md_flat", run_name="r", optimizer=optimizer),
            None,
            None,
            work=tmp_path / "r",
        )

    first, second, third = loop("optuna"), loop("optuna"), loop("simba")
    assert first._claim_state_dir() == tmp_path / "r"
    assert (
        second._claim_state_dir() == tmp_path / "r" / "workers" / "1"
    )  # never the first one's checkpoint
    with pytest.raises(ConfigError, match="only --optimizer optuna"):
        third._claim_state_dir()
    first._lock.close()  # the first worker ended: a restarted one resumes its state
    assert loop("optuna")._claim_state_dir() == tmp_path / "r"
    second._lock.close()


# --- the Optuna optimizer on a shared study, with instructions already proposed (no LM) ----------


def stub_evaluator():
    base = Candidate(
        sites={
            "answer": SiteState(instructions="seed answer"),
            "md_flat.curate": SiteState(instructions="seed curate"),
        },
        knobs={"top_k": 5},
    )
    return SimpleNamespace(
        system_name="md_flat",
        baseline=lambda: base.model_copy(deep=True),
        knob_choices=get_system("md_flat").knob_choices,
    ), base


def optimizers(workers, n: int, budget: int, instructions: list[str]):
    evaluator, base = stub_evaluator()
    studies = [workers(f"w{i}", budget=budget) for i in range(n)]
    studies[0].claim("instructions:answer", instructions)
    opts = []
    for study in studies:
        opt = OptunaOptimizer(
            evaluator, None, None, sites=["answer"], knobs=["top_k"], shared=study
        )
        opt.mark_seen(base)
        opts.append(opt)
    return opts, base


def test_workers_never_evaluate_the_same_candidate(workers):
    opts, base = optimizers(
        workers, 2, budget=6, instructions=["seed answer", "rewrite one", "rewrite two"]
    )
    evaluated: list[tuple[int, str]] = []
    best_eval = SimpleNamespace(accuracy=0.0, attributions=lambda: [])
    lock = threading.Lock()

    def work(i):
        opt = opts[i]
        while opt.shared.can_take():
            candidate = opt.propose(base, best_eval)
            if candidate is None:
                break
            slot = opt.shared.take_slot(candidate.digest(), opt.study_trial(candidate))
            if slot is None:
                opt.release(candidate)
                break
            with lock:
                evaluated.append((slot, candidate.digest()))
            opt.observe(
                candidate,
                SimpleNamespace(
                    accuracy=len(candidate.sites["answer"].instructions) / 100, stopped=None
                ),
                slot + 1,
            )
            opt.shared.publish_done(slot, {"trial": slot + 1, "accuracy": 0.0, "candidate": {}})
        opt.shared.leave()

    in_threads(work, range(2))
    digests = [d for _, d in evaluated]
    assert len(digests) == len(set(digests))  # no candidate twice
    assert sorted(s for s, _ in evaluated) == list(range(len(evaluated)))  # slots form a prefix
    assert (
        len(evaluated) == 6
    )  # 3 instructions x 5 top_k values = 15 candidates, minus the baseline: budget spent
    trials = opts[0].study.get_trials(deepcopy=False)
    assert len({t.number for t in trials}) == len(trials)
    told = [t for t in trials if "optloop:trial" in t.user_attrs]
    assert sorted(t.user_attrs["optloop:trial"] for t in told) == [1, 2, 3, 4, 5, 6]
    assert all(t.state.name != "RUNNING" for t in trials)


def test_a_small_space_is_exhausted_without_duplicates(workers):
    opts, base = optimizers(workers, 2, budget=10, instructions=["seed answer", "rewrite one"])
    for opt in opts:
        opt.knobs = []  # one site, 2 choices: a single candidate besides the baseline
        opt.max_duplicates = 5
    best_eval = SimpleNamespace(accuracy=0.0, attributions=lambda: [])
    first = opts[0].propose(base, best_eval)
    assert first is not None and first.sites["answer"].instructions == "rewrite one"
    assert opts[1].propose(base, best_eval) is None  # the only new candidate belongs to worker 0


# --- two real workers on PostgreSQL --------------------------------------------------------------


def _pg_bindir() -> Path | None:
    for bindir in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if all((bindir / tool).exists() for tool in ("initdb", "pg_ctl", "postgres")):
            return bindir
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def postgres_url():
    """A throwaway PostgreSQL server on 127.0.0.1 (trust auth) and an empty database in it."""
    bindir = _pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL server binaries (initdb, pg_ctl, postgres) not found under "
            "/usr/lib/postgresql/*/bin; "
            "install Debian's postgresql package (the Makefile's system-deps step)"
        )
    psycopg2 = pytest.importorskip(
        "psycopg2", reason="psycopg2 is missing: pip install psycopg2-binary"
    )
    as_user: list[str] = []
    root = Path(
        tempfile.mkdtemp(prefix="optloop-pg-")
    )  # not under pytest's tmp: the server's user must reach it
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: run it as the postgres OS user
        try:
            pw = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no `postgres` OS user to run the server as")
        if shutil.which("runuser") is None:
            shutil.rmtree(root)
            pytest.skip("running as root without runuser to start the server as the postgres user")
        os.chown(root, pw.pw_uid, pw.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = root / "data", _free_port()

    def pg(*args: str) -> None:
        subprocess.run(
            as_user + [str(a) for a in args], check=True, capture_output=True, timeout=120
        )

    try:
        pg(
            bindir / "initdb",
            "-D",
            data,
            "-A",
            "trust",
            "-U",
            "postgres",
            "-E",
            "UTF8",
            "--no-sync",
        )
        pg(
            bindir / "pg_ctl",
            "-D",
            data,
            "-l",
            root / "server.log",
            "-w",
            "-t",
            "60",
            "-o",
            f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off",
            "start",
        )
    except subprocess.CalledProcessError as exc:
        log = (root / "server.log").read_text() if (root / "server.log").exists() else ""
        shutil.rmtree(root, ignore_errors=True)
        raise AssertionError(
            f"PostgreSQL did not start: {exc.stderr.decode()[-500:]} {log[-500:]}"
        ) from None
    try:
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE optloop")
        conn.close()
        # trust auth ignores the password
        yield f"postgresql://postgres:{SECRET}@127.0.0.1:{port}/optloop"
    finally:
        subprocess.run(
            as_user + [str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"],
            capture_output=True,
            timeout=120,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.integration  # two real workers on a loopback endpoint: about 20 s
def test_two_workers_share_one_study_on_postgresql(postgres_url, tmp_path):
    import mlflow
    import optuna
    from mlflow.tracking import MlflowClient

    budget = 3
    uri = f"sqlite:///{tmp_path / 'ml' / 'mlflow.db'}"
    procs = []
    # The oracle endpoint answers the same on every machine (a small model's proposals may be cut
    # off on one CPU and not another); its delay keeps the run long enough for both to work.
    with OracleEndpoint(delay=0.15) as endpoint:
        env = {
            **os.environ,
            "OPTLOOP_HOME": str(tmp_path / "state"),
            "OPTLOOP_MLRUNS": str(tmp_path / "ml"),
            "OPTLOOP_EMBED": "openai:oracle",
            "OPENAI_BASE_URL": endpoint.base_url,
        }
        # same command, same state dir (one machine), one LM cache, one MLflow store
        for i in range(2):
            out = open(tmp_path / f"worker{i}.log", "w")  # noqa: SIM115 - closed below
            procs.append(
                (
                    subprocess.Popen(
                        [
                            sys.executable,
                            "-m",
                            "optloop.run",
                            "--system",
                            "md_flat",
                            "--dataset",
                            DATASET,
                            "--allow-small-splits",
                            "--optimizer",
                            "optuna",
                            "--budget",
                            str(budget),
                            "--start",
                            f"answer=+{PLANTED}",
                            "--sites",
                            "answer",
                            "--lm",
                            "openai:oracle",
                            "--lm-base-url",
                            endpoint.base_url,
                            "--storage",
                            postgres_url,
                            "--run-name",
                            "shared",
                            "--tracking-uri",
                            uri,
                            "--json",
                            str(tmp_path / f"result{i}.json"),
                        ],
                        cwd=REPO,
                        env=env,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    ),
                    out,
                )
            )
        try:
            for proc, _ in procs:
                proc.wait(timeout=600)
        finally:
            for proc, out in procs:
                if proc.poll() is None:
                    proc.kill()
                out.close()
    logs = [(tmp_path / f"worker{i}.log").read_text() for i in range(2)]
    assert [p.returncode for p, _ in procs] == [0, 0], logs

    results = [json.loads((tmp_path / f"result{i}.json").read_text()) for i in range(2)]
    for r in results:
        r.pop("lm", None)  # the LM calls of that process
    assert results[0] == results[1]  # every worker prints the one result of the run
    assert results[0]["evaluations"] == budget

    study = optuna.load_study(study_name="shared", storage=storage_url(postgres_url))
    trials = study.get_trials(deepcopy=False)
    assert len({t.number for t in trials}) == len(trials)  # trial numbers unique
    evaluated = [t for t in trials if "optloop:trial" in t.user_attrs]
    assert sorted(t.user_attrs["optloop:trial"] for t in evaluated) == list(range(1, budget + 1))
    assert len({t.user_attrs["optloop:digest"] for t in evaluated}) == budget
    assert all(t.state.name in ("COMPLETE", "FAIL") for t in trials)
    shared = SharedStudy(postgres_url, "shared", worker="reader", budget=budget)
    try:
        assert len(set(shared.scan("optloop:worker:").values())) == 2  # both joined
    finally:
        shared.close()

    mlflow.set_tracking_uri(uri)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("optloop-md_flat")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    parent = parents[0]
    assert parent.info.run_id == results[0]["parent_run_id"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(children) == len(runs) - 1 == budget  # every child under the one parent
    assert sorted(int(c.data.params["trial"]) for c in children) == list(range(1, budget + 1))
    assert (
        len({c.data.params["candidate"] for c in children}) == budget
    )  # no candidate evaluated twice
    assert (
        len(client.get_metric_history(parent.info.run_id, "acc_dev")) == budget + 1
    )  # the baseline once
    assert parent.data.metrics["evaluations"] == budget
    assert parent.data.params["storage"].startswith(
        "postgresql://postgres:***@"
    )  # the password never reaches MLflow
    assert not any(SECRET in text for text in logs + [json.dumps(r) for r in results])
    by_worker = {c.data.tags["optloop.worker"] for c in children}
    print(f"children by worker: {sorted(by_worker)}; optuna trials asked: {len(trials)}")


def test_a_batch_of_asks_is_distinct_and_the_same_for_the_same_seed(tmp_path):
    """--batch 3 with Optuna: three asks before any tell, each a candidate no other ask of the
    batch holds (TPE's constant liar counts the running ones), and the same three for the same
    seed; their tells complete them."""
    batches = []
    for run in range(2):
        study = open_study(f"sqlite:///{tmp_path / f'batch{run}.db'}", "w0", budget=9)
        try:
            evaluator, base = stub_evaluator()
            study.claim("instructions:answer", ["seed answer", "rewrite one", "rewrite two"])
            opt = OptunaOptimizer(
                evaluator, None, None, sites=["answer"], knobs=["top_k"], shared=study, batch=3
            )
            opt.mark_seen(base)
            best_eval = SimpleNamespace(accuracy=0.0, attributions=list)
            batch = opt.propose_batch(base, best_eval, 3)
            assert len(batch) == 3 and len({c.digest() for c in batch}) == 3
            for i, candidate in enumerate(batch, 1):
                opt.observe(candidate, SimpleNamespace(accuracy=i / 10, stopped=None), i)
            assert not opt.pending
            batches.append([c.digest() for c in batch])
        finally:
            study.close()
    assert batches[0] == batches[1]
