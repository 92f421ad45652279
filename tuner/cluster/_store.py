"""The per-cluster calibration store: every finished trial of every study, in the study's own database.

Two SQLAlchemy tables beside Optuna's (same URL: SQLite by default, PostgreSQL works): measured runs (a topology,
its role, the workload and the metrics of every concurrency level) and launch failures (a layout and its flags
that crashed). Rows are keyed by the ClusterKey, never by model: tuner.cluster._knowledge learns from all of them.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import sqlalchemy as sa

from tuner.cluster._key import ClusterKey
from tuner.errors import ConfigError
from tuner.metrics import ServingMetrics
from tuner.sqlite import use_wal
from tuner.topology import Role, Topology
from tuner.trial_status import TrialStatus
from tuner.workload import Workload

DEFAULT_PREFIX = "topotune_cluster_"
#: Statuses that say something about the cluster, not the model: a layout and flags that crashed at start-up
#: (OOM and a too-small KV cache depend on the model's size, so they do not transfer).
TRANSFERABLE_FAILURES = frozenset({TrialStatus.CRASHED, TrialStatus.TIMEOUT})

_LOCK = threading.Lock()
_ENGINES: dict[str, sa.Engine] = {}


@dataclass(frozen=True)
class StoredRun:
    """One measured trial: what ran, for which model, and what it measured at each concurrency level."""

    model_name: str
    model_path: str
    role: Role
    topology: Topology
    workload: Workload
    points: tuple[ServingMetrics, ...]
    study: str
    trial: int


@dataclass(frozen=True)
class StoredFailure:
    """A launch that failed on this cluster: the layout and flags that crashed, and for which model."""

    model_name: str
    topology: Topology
    status: TrialStatus
    reason: str
    study: str

    @property
    def transferable(self) -> bool:
        return self.status in TRANSFERABLE_FAILURES


def _engine(url: str) -> sa.Engine:
    with _LOCK:
        engine = _ENGINES.get(url)
        if engine is None:
            kwargs: dict = {"pool_pre_ping": True}
            if url.startswith("sqlite"):
                path = url.split("///", 1)[-1]
                if path and path != ":memory:":
                    Path(path).parent.mkdir(parents=True, exist_ok=True)
                kwargs = {"connect_args": {"timeout": 60}}
            try:
                engine = use_wal(sa.create_engine(url, **kwargs))
            except Exception as exc:  # ArgumentError, a missing driver (ImportError)
                raise ConfigError(f"cannot open storage {url!r}: {exc}", field="--storage",
                                  fix="use sqlite:///PATH or postgresql+psycopg://USER@HOST/DB") from exc
            _ENGINES[url] = engine
        return engine


def cluster_metadata(prefix: str = DEFAULT_PREFIX) -> sa.MetaData:
    """The cluster tables (runs, failures, the transfer guard's verdicts) under `prefix`: the one definition the
    store and the service's Alembic migration both create."""
    meta = sa.MetaData()
    sa.Table(
        f"{prefix}runs", meta, sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *[sa.Column(n, sa.String(128), nullable=False) for n in _KEY_FIELDS],
        sa.Column("model_name", sa.String(256), nullable=False),
        sa.Column("model_path", sa.String(4096), nullable=False), sa.Column("role", sa.String(16), nullable=False),
        sa.Column("topology", sa.Text, nullable=False), sa.Column("workload", sa.Text, nullable=False),
        sa.Column("points", sa.Text, nullable=False), sa.Column("study", sa.String(512), nullable=False),
        sa.Column("trial", sa.Integer, nullable=False), sa.Column("created_at", sa.Float, nullable=False),
        sa.UniqueConstraint("study", "trial", name=f"{prefix}runs_study_trial"),
        sa.Index(f"{prefix}runs_cluster", "cluster"))
    sa.Table(
        f"{prefix}failures", meta, sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *[sa.Column(n, sa.String(128), nullable=False) for n in _KEY_FIELDS],
        sa.Column("model_name", sa.String(256), nullable=False), sa.Column("topology", sa.Text, nullable=False),
        sa.Column("status", sa.String(32), nullable=False), sa.Column("reason", sa.Text, nullable=False),
        sa.Column("study", sa.String(512), nullable=False), sa.Column("created_at", sa.Float, nullable=False),
        sa.Index(f"{prefix}failures_cluster", "cluster"))
    # what the transfer guard (tuner.cluster._guard) decided for each new model's study, as JSON
    sa.Table(
        f"{prefix}guards", meta, sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        *[sa.Column(n, sa.String(128), nullable=False) for n in _KEY_FIELDS],
        sa.Column("model_name", sa.String(256), nullable=False), sa.Column("study", sa.String(512), nullable=False),
        sa.Column("verdict", sa.Text, nullable=False), sa.Column("created_at", sa.Float, nullable=False),
        sa.Index(f"{prefix}guards_cluster", "cluster"))
    return meta


_CREATE_ATTEMPTS = 8
_CREATE_LOCKS: dict[str, threading.Lock] = {}


def create_cluster_tables(bind: sa.Engine | sa.Connection, meta: sa.MetaData, url: str = "") -> None:
    """Create every table and index of `meta` that is missing, then verify they all exist.

    Several processes (studies started at once, a CLI beside the service) may create them on a fresh database
    together: the loser of a race gets "already exists" (or, on PostgreSQL, a duplicate pg_type row) for one
    object while the others may not exist yet. So a lost race is never taken as done: create again with
    checkfirst and verify every table and index, a few times, before answering. Threads of one process take
    turns (one lock per URL) so they do not race each other at all."""
    with _LOCK:
        lock = _CREATE_LOCKS.setdefault(url or str(id(bind)), threading.Lock())
    with lock:
        last: Exception | None = None
        for attempt in range(_CREATE_ATTEMPTS):
            try:
                if isinstance(bind, sa.Connection):
                    meta.create_all(bind, checkfirst=True)
                    for index in _indexes(meta):
                        index.create(bind, checkfirst=True)
                else:
                    with bind.begin() as conn:
                        meta.create_all(conn, checkfirst=True)
                    with bind.begin() as conn:
                        for index in _indexes(meta):
                            index.create(conn, checkfirst=True)
            except sa.exc.SQLAlchemyError as exc:
                if not _lost_creation_race(exc):
                    first = str(exc).strip().splitlines()[0]
                    raise ConfigError(f"cannot create the cluster tables in {url!r}: {first}", field="--storage",
                                      fix="check the URL and that the database server is reachable") from exc
                last = exc
            missing = _missing(bind, meta)
            if not missing:
                return
            if isinstance(bind, sa.Connection):  # inside a migration: no retry can see another transaction
                break
            time.sleep(0.05 * (attempt + 1))
        reason = str(last).strip().splitlines()[0] if last is not None else "they were not created"
        raise ConfigError(f"the cluster tables {', '.join(missing)} are missing in {url!r} after "
                          f"{_CREATE_ATTEMPTS} attempts ({reason})", field="--storage",
                          fix="check that the database user may create tables, then run the command again")


def _indexes(meta: sa.MetaData) -> list[sa.Index]:
    return [index for table in meta.sorted_tables for index in table.indexes]


def _lost_creation_race(exc: sa.exc.SQLAlchemyError) -> bool:
    """Another creator got there first: "already exists" (SQLite, PostgreSQL), or PostgreSQL's unique violation
    on pg_type / pg_class when two transactions create the same table at once."""
    text = str(exc)
    return "already exists" in text or isinstance(exc, sa.exc.IntegrityError) or "pg_type" in text \
        or "pg_class" in text


def _missing(bind: sa.Engine | sa.Connection, meta: sa.MetaData) -> list[str]:
    inspector = sa.inspect(bind)
    found_tables = set(inspector.get_table_names())
    missing = [name for name in meta.tables if name not in found_tables]
    for table in meta.sorted_tables:
        if table.name in found_tables:
            found_indexes = {ix["name"] for ix in inspector.get_indexes(table.name)}
            missing += [ix.name for ix in table.indexes if ix.name not in found_indexes]
    return missing


class ClusterStore:
    """Reads and writes the cluster tables of one database (created on first use; `prefix` isolates tests)."""

    def __init__(self, url: str, prefix: str = DEFAULT_PREFIX) -> None:
        self.url = url
        self.engine = _engine(url)
        self._meta = cluster_metadata(prefix)
        self.runs = self._meta.tables[f"{prefix}runs"]
        self.failures = self._meta.tables[f"{prefix}failures"]
        self.guards = self._meta.tables[f"{prefix}guards"]
        create_cluster_tables(self.engine, self._meta, url)

    def drop(self) -> None:
        """Remove this store's tables (tests with a unique prefix clean up with it)."""
        self._meta.drop_all(self.engine)

    # -- writing -----------------------------------------------------------------------------------------
    def record_run(self, key: ClusterKey, run: StoredRun) -> None:
        row = {**_key_row(key), "model_name": run.model_name, "model_path": run.model_path, "role": run.role.value,
               "topology": run.topology.model_dump_json(), "workload": run.workload.model_dump_json(),
               "points": json.dumps([p.model_dump(mode="json") for p in run.points]), "study": run.study,
               "trial": run.trial, "created_at": time.time()}
        with self.engine.begin() as conn:
            exists = conn.execute(sa.select(self.runs.c.id).where(self.runs.c.study == run.study,
                                                                  self.runs.c.trial == run.trial)).first()
            if exists is None:  # a resumed study tells a trial once; a replay must not count it twice
                conn.execute(self.runs.insert().values(**row))

    def record_failure(self, key: ClusterKey, failure: StoredFailure) -> None:
        with self.engine.begin() as conn:
            conn.execute(self.failures.insert().values(
                **_key_row(key), model_name=failure.model_name, topology=failure.topology.model_dump_json(),
                status=failure.status.value, reason=failure.reason[:2000], study=failure.study,
                created_at=time.time()))

    def record_guard(self, key: ClusterKey, model_name: str, study: str, verdict: dict) -> None:
        """A transfer guard's verdict (GuardVerdict.as_json) for one study."""
        with self.engine.begin() as conn:
            conn.execute(self.guards.insert().values(**_key_row(key), model_name=model_name, study=study,
                                                     verdict=json.dumps(verdict), created_at=time.time()))

    # -- reading -----------------------------------------------------------------------------------------
    def read_guards(self, key: ClusterKey) -> list[dict]:
        """Every guard verdict on this cluster, oldest first (each GuardVerdict.as_json plus its study)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(self.guards).where(*_match(self.guards, key))
                                .order_by(self.guards.c.id)).all()
        return [{**json.loads(r.verdict), "study": r.study} for r in rows]

    def read_runs(self, key: ClusterKey) -> list[StoredRun]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(self.runs).where(*_match(self.runs, key)).order_by(self.runs.c.id)).all()
        return [StoredRun(model_name=r.model_name, model_path=r.model_path, role=Role(r.role),
                          topology=Topology.model_validate_json(r.topology),
                          workload=Workload.model_validate_json(r.workload),
                          points=tuple(ServingMetrics.model_validate(p) for p in json.loads(r.points)),
                          study=r.study, trial=r.trial) for r in rows]

    def read_failures(self, key: ClusterKey) -> list[StoredFailure]:
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(self.failures).where(*_match(self.failures, key))
                                .order_by(self.failures.c.id)).all()
        return [StoredFailure(model_name=r.model_name, topology=Topology.model_validate_json(r.topology),
                              status=TrialStatus(r.status), reason=r.reason, study=r.study) for r in rows]

    def clusters(self) -> list[ClusterKey]:
        """Every cluster key with at least one stored run or failure."""
        cols = [self.runs.c[n] for n in _KEY_FIELDS]
        fcols = [self.failures.c[n] for n in _KEY_FIELDS]
        with self.engine.connect() as conn:
            found = {tuple(r) for r in conn.execute(sa.select(*cols).distinct()).all()}
            found |= {tuple(r) for r in conn.execute(sa.select(*fcols).distinct()).all()}
        return [ClusterKey(*k) for k in sorted(found)]


_KEY_FIELDS = ("cluster", "gpu_class", "interconnect", "vllm_version", "kernel_family")


def _key_row(key: ClusterKey) -> dict[str, str]:
    return {"cluster": key.name, "gpu_class": key.gpu_class, "interconnect": key.interconnect,
            "vllm_version": key.vllm_version, "kernel_family": key.kernel_family}


def _match(table: sa.Table, key: ClusterKey) -> list:
    return [table.c[name] == value for name, value in _key_row(key).items()]
