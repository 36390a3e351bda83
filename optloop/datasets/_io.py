"""Reading source files and reporting what is wrong with them, one line each.

Every load failure is a :class:`~optloop.errors.DatasetError` whose message reads
``<file>: <line N | record N (id)>: field '<name>': <problem> (<fix>)`` so that a
user can open the file at the right place. Nothing here talks to an LM.
"""

from __future__ import annotations

import csv
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, overload

from pydantic import BaseModel, ValidationError

from optloop.errors import DatasetError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

SHARED_DATA_ENV = "OPTLOOP_SHARED_DATA"


def dataset_error(
    source: str | Path, where: str | None, field: str | None, problem: str, fix: str = ""
) -> DatasetError:
    """A one-line error naming the file, the line or record, and the field."""
    parts = [str(source)]
    if where:
        parts.append(where)
    if field:
        parts.append(f"field '{field}'")
    message = ": ".join(parts) + f": {problem}"
    if fix:
        message += f" ({fix})"
    return DatasetError(message)


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# A model-level validator cannot set pydantic's error location, so its message starts
# with the field path it is about ("questions[0].evidence_ids: ...").
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][\w\[\]\.]*): (.*)$", re.S)


def validation_error(source: str | Path, where: str | None, exc: ValidationError) -> DatasetError:
    """Turn pydantic's first error into the one-line form (other errors are counted)."""
    errors = exc.errors()
    first = errors[0]
    more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
    field = _loc(first["loc"])
    msg = first["msg"].removeprefix("Value error, ")
    if match := _FIELD_PREFIX.match(msg):
        field = f"{field}.{match[1]}" if field else match[1]
        msg = match[2]
    return dataset_error(source, where, field or None, msg + more)


@contextmanager
def record_context(source: str | Path, where: str | None) -> Iterator[None]:
    """Re-raise a model validation error while building one record as a DatasetError."""
    try:
        yield
    except ValidationError as exc:
        raise validation_error(source, where, exc) from None


def existing_file(text: str, scheme: str) -> Path:
    """The file a URI points at; a DatasetError saying so when it is missing."""
    if not text:
        raise DatasetError(f"{scheme}: no file given (use {scheme}:<path>)")
    path = Path(text).expanduser()
    if not path.is_file():
        raise dataset_error(
            path, None, None, "file not found", f"check the path given to {scheme}:"
        )
    return path


def json_error(
    source: str | Path,
    exc: json.JSONDecodeError,
    text: str,
    first_line: int = 1,
    unit: str = "file",
) -> DatasetError:
    """Bad JSON in ``text`` (the ``unit``, "file" or "line", starting on line ``first_line`` of
    ``source``), at the line and column where it went wrong. JSON that stops before its value ends
    (a file or a line cut off) is reported at the end of its last line, where the rest is missing,
    not at "column 1" of the empty line after it."""
    content = text.rstrip()
    if exc.pos >= len(content) or exc.msg.startswith("Unterminated string"):
        lineno = first_line + content.count("\n")
        column = len(content) - (content.rfind("\n") + 1)
        return dataset_error(
            source,
            f"line {lineno}",
            None,
            f"invalid JSON: the {unit} ends after column {column}, before its JSON value is "
            "complete (cut off?)",
        )
    return dataset_error(
        source,
        f"line {first_line + exc.lineno - 1}",
        None,
        f"invalid JSON: {exc.msg} at column {exc.colno}",
    )


def read_json(path: Path) -> Any:
    """Parse a JSON file; bad JSON names its line and column."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise dataset_error(path, None, None, f"cannot read file: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise json_error(path, exc, text) from None


def read_jsonl(path: Path) -> Iterator[tuple[int, Any]]:
    """Yield ``(line number, parsed value)`` for each non-blank line of a JSONL file."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise dataset_error(path, None, None, f"cannot read file: {exc}") from None
    with handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise json_error(path, exc, line, first_line=lineno, unit="line") from None


def read_jsonl_models(path: Path, model: type[M], what: str) -> list[M]:
    """One ``model`` per non-blank line of a JSONL file (``what``: one line's content, for the
    error); an error names the line, and an empty file is one."""
    records: list[M] = []
    for lineno, value in read_jsonl(path):
        where = f"line {lineno}"
        if not isinstance(value, dict):
            raise dataset_error(
                path,
                where,
                None,
                f"expected a JSON object ({what}), got {type(value).__name__}",
            )
        try:
            records.append(model.model_validate(value))
        except ValidationError as exc:
            raise validation_error(path, where, exc) from None
    if not records:
        raise dataset_error(path, None, None, "no episodes (the file is empty)")
    return records


def read_json_records(path: Path, container_key: str | None = None) -> list[tuple[str, Any]]:
    """Records of a JSON list (``"record N"``) or JSONL file (``"line N"``).

    A ``.jsonl`` suffix means one record per line; otherwise the file is one JSON
    value: a list of records, or an object holding the list under ``container_key``.
    """
    if path.suffix == ".jsonl":
        return [(f"line {n}", value) for n, value in read_jsonl(path)]
    data = read_json(path)
    if container_key and isinstance(data, dict) and container_key in data:
        data = data[container_key]
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise dataset_error(
            path, None, None, f"expected a JSON list of records, got {type(data).__name__}"
        )
    return [(f"record {i}", value) for i, value in enumerate(data)]


def load_json_episodes(
    rest: str, scheme: str, build: Callable[[str, Any, Path], T], what: str
) -> tuple[str, list[T]]:
    """A JSON/JSONL dataset of one episode per record (LoCoMo, LongMemEval):
    ``build(where, record, path)`` makes each, with any error pointing at its record; returns
    ``"<scheme>:<file stem>"`` and the episodes. An empty file is an error naming ``what`` it lacks
    (``"samples"``)."""
    path = existing_file(rest, scheme)
    episodes = []
    for where, record in read_json_records(path):
        with record_context(path, where):
            episodes.append(build(where, record, path))
    if not episodes:
        raise dataset_error(path, None, None, f"no {what}")
    return f"{scheme}:{path.stem}", episodes


def read_csv(path: Path, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """Rows of a CSV with a header, as ``(first line of the row, row)``.

    A missing required column fails on line 1; a row with too few cells fails on its
    own line, naming the first missing column.
    """
    try:
        handle = path.open(encoding="utf-8", newline="")
    except OSError as exc:
        raise dataset_error(path, None, None, f"cannot read file: {exc}") from None
    rows: list[tuple[int, dict[str, str]]] = []
    with handle:
        reader = csv.DictReader(handle)
        try:
            header = reader.fieldnames or []
            missing = [c for c in required if c not in header]
            if missing:
                raise dataset_error(
                    path,
                    "line 1 (header)",
                    missing[0],
                    "missing column",
                    f"found columns: {', '.join(header) or 'none'}",
                )
            start = reader.line_num + 1
            for row in reader:
                for column in header:
                    if row.get(column) is None:
                        raise dataset_error(
                            path, f"line {start}", column, "missing value (row has too few cells)"
                        )
                rows.append((start, row))
                start = reader.line_num + 1
        except csv.Error as exc:
            raise dataset_error(
                path, f"line {reader.line_num}", None, f"malformed CSV: {exc}"
            ) from None
    return rows


def require(
    record: Any,
    field: str,
    source: str | Path,
    where: str,
    kind: type | tuple[type, ...] = str,
    prefix: str = "",
) -> Any:
    """``record[field]``, checked to exist, be non-empty and have the expected type.

    Numbers are accepted where a string is expected (and returned as strings). The
    error names the field as ``prefix + field`` (e.g. ``qa[3].question``).
    """
    label = prefix + field
    if not isinstance(record, Mapping):
        raise dataset_error(
            source,
            where,
            prefix.rstrip(".") or None,
            f"expected a JSON object, got {type(record).__name__}",
        )
    if field not in record or record[field] is None:
        raise dataset_error(source, where, label, "missing")
    value = record[field]
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, kind):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise dataset_error(source, where, label, f"expected {names}, got {type(value).__name__}")
    if isinstance(value, str) and not value.strip():
        raise dataset_error(source, where, label, "empty")
    return value


def json_cell(text: str, source: str | Path, where: str, field: str, kind: type = list) -> Any:
    """A CSV cell that holds JSON (MemFail stores lists this way)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise dataset_error(source, where, field, f"invalid JSON in cell: {exc.msg}") from None
    if not isinstance(value, kind):
        raise dataset_error(
            source, where, field, f"expected a JSON {kind.__name__}, got {type(value).__name__}"
        )
    return value


def shared_data_dirs() -> list[Path]:
    """Where the project's shared benchmark data may live, most specific first.

    ``$OPTLOOP_SHARED_DATA`` when set (and only it), else ``../shared/data`` next to the
    repository and next to the working directory. Nothing in the product needs it.
    """
    env = os.environ.get(SHARED_DATA_ENV)
    if env:
        return [Path(env).expanduser()]
    repo_root = Path(__file__).resolve().parents[2]
    candidates = [repo_root.parent / "shared" / "data", Path.cwd().parent / "shared" / "data"]
    out: list[Path] = []
    for c in candidates:
        if c not in out:
            out.append(c)
    return out


@overload
def int_param(uri: str, params: dict[str, str], name: str, minimum: int, default: int) -> int: ...


@overload
def int_param(
    uri: str, params: dict[str, str], name: str, minimum: int, default: None = None
) -> int | None: ...


def int_param(
    uri: str, params: dict[str, str], name: str, minimum: int, default: int | None = None
) -> int | None:
    """The integer query parameter ``name`` of a dataset URI (``default`` when absent), at least
    ``minimum``."""
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise dataset_error(uri, None, name, f"expected an integer >= {minimum}, got {raw!r}")
    return value
