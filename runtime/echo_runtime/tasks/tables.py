"""Reading rows out of a user's data files: JSONL, JSON, CSV, Parquet, and ``datasets`` directories.

Every row comes back as a :class:`Row`: its columns and *where* it is (``data.jsonl:12``, ``data.csv:line
7``, ``data.parquet:row 3``), so every later complaint about it can name the file and the row. A file
that cannot be read is a ValueError naming the file and, when there is one, the line.

A ``datasets`` directory (written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``) is read
with pyarrow from the Arrow stream files its ``state.json`` lists, so the ``datasets`` package is not
needed to read one; a ``DatasetDict`` directory (``dataset_dict.json``) holds one such directory per split.
"""

from __future__ import annotations

import csv
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

Format = Literal["Auto", "JSONL", "JSON", "CSV", "Parquet", "Datasets"]

_EXTENSIONS: dict[str, Format] = {
    ".jsonl": "JSONL", ".ndjson": "JSONL", ".json": "JSON", ".csv": "CSV", ".parquet": "Parquet",
    ".pq": "Parquet",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of a data file."""

    columns: Mapping[str, Any]
    where: str
    """``<file>:<line or row>``, for messages."""


def detect_format(path: Path, given: Format = "Auto") -> Format:
    """The format to read ``path`` with: ``given``, or by extension (a directory is a datasets directory)."""
    if given != "Auto":
        return given
    if path.is_dir():
        return "Datasets"
    found = _EXTENSIONS.get(path.suffix.lower())
    if found is None:
        raise ValueError(
            f"{path}: cannot tell the format from the extension {path.suffix!r}; use .jsonl, .json, .csv or "
            f".parquet, a datasets directory, or set format"
        )
    return found


def read(path: str | Path, fmt: Format = "Auto", split: str | None = None) -> list[Row]:
    """Every row of the file or datasets directory ``path`` (``split`` picks one of a ``DatasetDict``)."""
    file = Path(path).expanduser()
    if not file.exists():
        raise ValueError(f"data file {str(file)!r} does not exist")
    kind = detect_format(file, fmt)
    if split is not None and kind != "Datasets":
        raise ValueError(f"{file}: split {split!r} applies to datasets directories only, this is {kind}")
    try:
        if kind == "JSONL":
            return _jsonl(file)
        if kind == "JSON":
            return _json(file)
        if kind == "CSV":
            return _csv(file)
        if kind == "Parquet":
            return _parquet(file)
        return _datasets(file, split)
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read data file {str(file)!r}: {exc}") from None


def splits_of(path: str | Path) -> list[str] | None:
    """The split names of a ``DatasetDict`` directory, or None for anything else."""
    index = Path(path).expanduser() / "dataset_dict.json"
    if not index.is_file():
        return None
    data = json.loads(index.read_text(encoding="utf-8"))
    names = data.get("splits") if isinstance(data, dict) else None
    return [str(n) for n in names] if isinstance(names, list) else None


def _jsonl(file: Path) -> list[Row]:
    rows = []
    # split("\n"), not splitlines(): JSON strings may hold U+2028 and friends, which splitlines breaks on.
    for number, line in enumerate(file.read_text(encoding="utf-8").split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{file}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{where}: not valid JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        rows.append(Row(record, where))
    return rows


def _json(file: Path) -> list[Row]:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{file}:{error.lineno}: not valid JSON ({error.msg}, column {error.colno})"
        ) from None
    if not isinstance(data, list):
        raise ValueError(f"{file}: expected a JSON array of objects (one per row), got {type(data).__name__}")
    rows = []
    for index, record in enumerate(data):
        where = f"{file}:[{index}]"
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        rows.append(Row(record, where))
    return rows


def _csv(file: Path) -> list[Row]:
    rows = []
    with file.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames:
            raise ValueError(f"{file}: no header row (the first line names the columns)")
        for record in reader:
            where = f"{file}:line {reader.line_num}"
            if None in record:
                raise ValueError(f"{where}: more values than the header has columns")
            rows.append(Row({k: v for k, v in record.items() if k is not None}, where))
    return rows


def _table_rows(table: Any, name: str) -> list[Row]:
    return [Row(record, f"{name}:row {index}") for index, record in enumerate(table.to_pylist())]


def _parquet(file: Path) -> list[Row]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(file)
    except (pa.ArrowException, ValueError) as exc:
        raise ValueError(f"{file}: not a readable Parquet file ({exc})") from None
    return _table_rows(table, str(file))


def _datasets(folder: Path, split: str | None) -> list[Row]:
    import pyarrow as pa

    names = splits_of(folder)
    if names is not None:
        chosen = split or "train"
        if chosen not in names:
            raise ValueError(f"{folder}: no split {chosen!r}; its splits are {', '.join(names)}")
        return _datasets(folder / chosen, None)
    if split is not None:
        raise ValueError(f"{folder}: split {split!r} given, but this is a single dataset, not a DatasetDict")
    state_file = folder / "state.json"
    if not state_file.is_file():
        raise ValueError(
            f"{folder}: not a datasets directory (no state.json or dataset_dict.json; write one with "
            f"Dataset.save_to_disk)"
        )
    state = json.loads(state_file.read_text(encoding="utf-8"))
    files = state.get("_data_files") if isinstance(state, dict) else None
    if not isinstance(files, list) or not files:
        raise ValueError(f"{state_file}: lists no data files (_data_files)")
    tables = []
    for entry in files:
        name = entry.get("filename") if isinstance(entry, dict) else None
        if not isinstance(name, str):
            raise ValueError(f"{state_file}: a _data_files entry has no filename: {entry!r}")
        try:
            with pa.memory_map(str(folder / name)) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        except (pa.ArrowException, OSError) as exc:
            raise ValueError(f"{folder / name}: not a readable Arrow file ({exc})") from None
    return _table_rows(pa.concat_tables(tables), str(folder))
