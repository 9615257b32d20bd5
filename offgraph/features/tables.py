"""Reading raw training tables (Parquet, CSV/TSV, JSON lines) into pyarrow.

`read_table` is the one entry point. Text formats are read with every column
as a string first and then converted only where that loses nothing:

- a column whose every non-null value is a canonical decimal integer
  ("0", "-12", "1382"; no leading zeros, at most 18 digits) becomes int64;
- a column mixing such integers with decimals that contain a '.'
  ("0.5", "-1.25e3") becomes float64;
- anything else stays a string. So Criteo's hex ids ("68fd1e64", "3e10",
  "00a1b2c3") and zip codes ("00501") stay strings whatever the block-wise
  type inference of pyarrow would have guessed, and integer columns with
  missing values ("", i.e. an empty field) are int64 with nulls.

Empty fields are nulls (never "" and never 0). `types` overrides the
inference per column. A malformed row raises `DataError` naming the file and
the line number; so does a missing file (not a bare path), a CSV line longer
than the reader can take (`MAX_CSV_LINE`), and a directory that is not a
Parquet dataset. `row_locator` names a data row as the file's line, for
messages about a row's values (`offgraph features load`).
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

__all__ = ["DataError", "read_table", "detect_format", "row_locator", "parquet_files", "column_names"]

FORMATS = ("parquet", "csv", "tsv", "json")

_COMPRESSION_SUFFIXES = {".gz", ".gzip", ".bz2", ".brotli", ".br", ".zst", ".zstd", ".lz4", ".snappy"}
_EXT_FORMAT = {
    ".parquet": "parquet",
    ".pq": "parquet",
    ".parq": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".tab": "tsv",
    ".json": "json",
    ".jsonl": "json",
    ".ndjson": "json",
}

# Lossless conversions of text fields (see the module docstring).
_INT_RE = r"^-?(0|[1-9][0-9]{0,17})$"
_FLOAT_RE = r"^-?(0|[1-9][0-9]*)$|^[+-]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$"

CSV_BLOCK_SIZES = (1 << 20, 1 << 24, 1 << 28)
"""pyarrow reads CSV in blocks that must hold whole lines: 1 MiB first (its default), then larger ones
for a file whose header or rows are longer (a file of some 10^5 columns has a header line over 1 MiB)."""
MAX_CSV_LINE = CSV_BLOCK_SIZES[-1]


class DataError(ValueError):
    """A raw table cannot be read: malformed row, unknown format, missing column."""


def detect_format(path: str | os.PathLike) -> str:
    """Format of `path` from its extension, ignoring a compression suffix
    (`x.parquet.brotli` -> parquet, `x.csv.gz` -> csv). A directory is read
    as a Parquet dataset (every file in it must be one: ``parquet_files``)."""
    p = os.fspath(path)
    if os.path.isdir(p):
        return "parquet"
    name = os.path.basename(p).lower()
    while True:
        stem, ext = os.path.splitext(name)
        if not ext:
            break
        if ext in _EXT_FORMAT:
            return _EXT_FORMAT[ext]
        if ext not in _COMPRESSION_SUFFIXES:
            break
        name = stem
    raise DataError(f"{p}: cannot tell the format from the file name; pass fmt= one of {FORMATS}")


def read_table(
    path: str | os.PathLike,
    fmt: str | None = None,
    columns: Sequence[str] | None = None,
    header: bool | None = None,
    names: Sequence[str] | None = None,
    sep: str | None = None,
    types: Mapping[str, pa.DataType | str] | None = None,
) -> pa.Table:
    """Read a raw table.

    fmt: "parquet", "csv", "tsv" or "json" (JSON lines); default from the
      file extension. columns: keep only these columns (in this order).
    CSV/TSV only: header (default: True unless `names` is given; with both,
      the file's header line is skipped and replaced by `names`), names
      (column names), sep (default "," for csv, tab for tsv).
    types: column -> pyarrow type (or type name), overriding the inference.
    """
    p = _existing(path)
    fmt = (fmt or detect_format(p)).lower()
    if fmt in ("jsonl", "ndjson"):
        fmt = "json"
    if fmt not in FORMATS:
        raise DataError(f"{p}: unknown format {fmt!r}; expected one of {FORMATS}")
    if fmt in ("parquet", "json") and names is not None:
        raise DataError(f"{p}: names= only applies to CSV/TSV files")

    if fmt == "parquet":
        table = _read_parquet(p, columns)
    elif fmt == "json":
        table = _read_json(p)
    else:
        if sep is None:
            sep = "\t" if fmt == "tsv" else ","
        table = _read_csv(p, columns, header, names, sep)

    if columns is not None:
        _check_columns(p, table, columns)
        table = table.select(list(columns))
    if types:
        table = _apply_types(p, table, types)
    return table


def _existing(path: str | os.PathLike) -> str:
    p = os.fspath(path)
    if not os.path.exists(p):
        raise DataError(
            f"{p}: no such file"
            + ("" if os.path.isdir(os.path.dirname(p) or ".") else f" (nor directory {os.path.dirname(p)})")
        )
    return p


def column_names(
    path: str | os.PathLike,
    fmt: str | None = None,
    header: bool | None = None,
    names: Sequence[str] | None = None,
    sep: str | None = None,
) -> list[str] | None:
    """The columns ``read_table`` would give for these arguments, without reading the rows (a Parquet
    file's schema, a CSV / TSV file's header line), so that a missing column is reported at once; None
    where only the rows tell (JSON lines). DataError as ``read_table`` for a missing or unknown file."""
    p = _existing(path)
    fmt = (fmt or detect_format(p)).lower()
    if names is not None:
        return [str(n) for n in names]
    if fmt == "parquet":
        try:
            return pq.read_schema(parquet_files(p)[0] if os.path.isdir(p) else p).names
        except (pa.ArrowInvalid, OSError) as e:
            raise DataError(f"{p}: cannot read Parquet: {e}") from e
    if fmt in ("csv", "tsv") and header is not False:
        with pa.input_stream(p, compression="detect") as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
            first = next(csv.reader(text, delimiter=sep or ("\t" if fmt == "tsv" else ",")), None)
        if first is not None:
            _check_header(p, first)
        return first
    return None


# ---------------------------------------------------------------- Parquet


def parquet_files(p: str) -> list[str]:
    """The files of the Parquet dataset in directory ``p`` (as pyarrow reads it: names starting with
    '_' or '.' are skipped); DataError for a directory without any, or holding another kind of file
    (a CSV beside them would be an unreadable "Parquet" file, or rows silently left out)."""
    found: list[str] = []
    other: list[str] = []
    for root, dirs, files in os.walk(p):
        dirs[:] = sorted(d for d in dirs if not d.startswith(("_", ".")))
        for f in sorted(files):
            if f.startswith(("_", ".")):
                continue
            path = os.path.join(root, f)
            fmt = None
            try:
                fmt = detect_format(path)
            except DataError:
                pass
            (found if fmt == "parquet" else other).append(path)
    if other:
        raise DataError(
            f"{p}: a directory is read as one Parquet dataset, but it holds {other[0]!r}, which is not "
            "a Parquet file (.parquet, .pq, .parq); pass one file, or a directory of Parquet files only"
        )
    if not found:
        raise DataError(f"{p}: a directory is read as one Parquet dataset, but it holds no Parquet file; pass a file")
    return found


def _read_parquet(p: str, columns: Sequence[str] | None) -> pa.Table:
    if os.path.isdir(p):
        parquet_files(p)
    if columns is not None:
        schema = pq.read_schema(p) if os.path.isfile(p) else None
        if schema is not None:
            _check_columns(p, schema, columns)
    try:
        return pq.read_table(p, columns=list(columns) if columns is not None else None)
    except (pa.ArrowInvalid, OSError) as e:
        raise DataError(f"{p}: cannot read Parquet: {e}") from e


# ---------------------------------------------------------------- CSV / TSV


def _read_csv(p, columns, header, names, sep) -> pa.Table:
    if header is None:
        header = names is None
    if names is not None:
        names = [str(n) for n in names]
        twice = sorted(n for n, k in Counter(names).items() if k > 1)
        if twice:
            raise DataError(f"{p}: duplicate column name(s) {twice} in names={names}")
    parse = pcsv.ParseOptions(delimiter=sep)
    block = CSV_BLOCK_SIZES[0]

    def read_options(use_threads=True):
        if names is not None:
            return pcsv.ReadOptions(
                column_names=names, skip_rows=1 if header else 0, use_threads=use_threads, block_size=block
            )
        if header:
            return pcsv.ReadOptions(use_threads=use_threads, block_size=block)
        return pcsv.ReadOptions(autogenerate_column_names=True, use_threads=use_threads, block_size=block)

    def long_lines(e: pa.ArrowInvalid) -> bool:
        """pyarrow's words for a line longer than its block ("Empty CSV file or block" for a long first line)."""
        m = str(e)
        return ("Empty CSV file or block" in m and os.path.getsize(p) > 0) or "straddling" in m.lower()

    def with_blocks(read, line: str, file_names=()):
        """``read()`` with larger blocks while pyarrow finds a line longer than one; DataError naming the
        problem (not pyarrow's "Empty CSV file or block") past ``MAX_CSV_LINE``."""
        nonlocal block
        while True:
            try:
                return read()
            except pa.ArrowInvalid as e:
                if long_lines(e) and block < MAX_CSV_LINE:
                    block = CSV_BLOCK_SIZES[CSV_BLOCK_SIZES.index(block) + 1]
                    continue
                if long_lines(e):
                    raise DataError(
                        f"{p}: {line} is longer than {MAX_CSV_LINE >> 20} MiB, more than a CSV line may "
                        "be (is it a CSV file, with line breaks?)"
                    ) from e
                if os.path.getsize(p) == 0:
                    raise DataError(f"{p}: the file is empty (no header line, no rows)") from e
                raise _csv_error(p, e, read_options, parse, file_names) from e

    def header_names():
        try:
            with pcsv.open_csv(p, read_options=read_options(), parse_options=parse) as reader:
                return reader.schema.names
        except StopIteration:  # empty file
            return list(names or [])

    # Column names, to read every column as a string.
    file_names = with_blocks(header_names, "line 1")
    _check_header(p, file_names)
    if columns is not None:
        _check_columns(p, file_names, columns)

    convert = pcsv.ConvertOptions(
        column_types={n: pa.string() for n in file_names},
        null_values=[""],
        strings_can_be_null=True,
        quoted_strings_can_be_null=True,
        include_columns=list(columns) if columns is not None else None,
    )
    table = with_blocks(
        lambda: pcsv.read_csv(p, read_options=read_options(), parse_options=parse, convert_options=convert),
        "a line",
        file_names,
    )
    return pa.table({n: _infer_column(table.column(n)) for n in table.column_names})


def _csv_error(p, err, read_options, parse, file_names=()) -> DataError:
    """Turn a pyarrow CSV parse error into a DataError naming the line.

    A single-threaded re-read makes pyarrow report the bad record's number
    (it counts records, not lines: blank lines and newlines inside quoted
    fields are not counted), which a scan with the csv module turns into the
    file's line number."""
    bad = []

    def handler(row):
        bad.append(row)
        return "error"

    try:
        pcsv.read_csv(
            p,
            read_options=read_options(use_threads=False),
            parse_options=pcsv.ParseOptions(delimiter=parse.delimiter, invalid_row_handler=handler),
            convert_options=pcsv.ConvertOptions(column_types={n: pa.string() for n in file_names}),
        )
    except pa.ArrowInvalid:
        pass
    msg, record = str(err), None
    if bad:
        r = bad[0]
        record = r.number
        msg = f"expected {r.expected_columns} fields, got {r.actual_columns}: {r.text[:200]!r}"
    if record is None:
        m = re.search(r"[Rr]ow #?(\d+)", str(err))
        record = int(m.group(1)) if m else None
    line = _record_line(p, parse.delimiter, record) if record is not None else None
    where = f"line {line}" if line is not None else "unknown line"
    return DataError(f"{p}: {where}: malformed row: {msg}")


def _record_line(p, sep, record: int) -> int:
    """First line of the record-th (1-based) non-blank CSV record of p."""
    try:
        with pa.input_stream(p, compression="detect") as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
            reader = csv.reader(text, delimiter=sep)
            n, prev = 0, 0
            for row in reader:
                if row:
                    n += 1
                    if n == record:
                        return prev + 1
                prev = reader.line_num
    except (csv.Error, OSError):
        pass
    return record  # fall back to the record number


def row_locator(
    path: str | os.PathLike,
    fmt: str | None = None,
    header: bool | None = None,
    names: Sequence[str] | None = None,
    sep: str | None = None,
):
    """``where(i) -> str``: data row i (0-based) of a file that ``read_table`` read with these arguments, as
    its reader finds it: ``line L`` of a CSV / TSV / JSON-lines file (blank lines and line breaks inside
    quoted fields counted, as in the file), ``row i+1`` of a Parquet file or dataset. The lines are
    scanned once, at the first call (a message about a row is rare; reading does not pay for it)."""
    p = os.fspath(path)
    fmt = (fmt or detect_format(p)).lower()
    if fmt not in ("csv", "tsv", "json", "jsonl", "ndjson"):
        return lambda i: f"row {i + 1}"
    lines: list[int] = []

    def scan() -> None:
        with pa.input_stream(p, compression="detect") as raw:
            text = io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="")
            if fmt in ("csv", "tsv"):
                reader = csv.reader(text, delimiter=sep or ("\t" if fmt == "tsv" else ","))
                prev, skip = 0, 1 if (names is None if header is None else header) else 0
                for row in reader:
                    if row:
                        if skip:
                            skip -= 1
                        else:
                            lines.append(prev + 1)
                    prev = reader.line_num
            else:
                lines.extend(n for n, line in enumerate(text, start=1) if line.strip())

    def where(i: int) -> str:
        if not lines:
            try:
                scan()
            except (csv.Error, OSError):
                pass
        return f"line {lines[i]}" if i < len(lines) else f"row {i + 1}"

    return where


def _infer_column(col: pa.ChunkedArray) -> pa.ChunkedArray:
    valid = col.drop_null()
    if len(valid) == 0:
        return col  # all null (or empty): keep it a string column
    if pc.all(pc.match_substring_regex(valid, _INT_RE)).as_py():
        return pc.cast(col, pa.int64())
    if pc.all(pc.match_substring_regex(valid, _FLOAT_RE)).as_py():
        return pc.cast(col, pa.float64())
    return col


# ---------------------------------------------------------------- JSON lines


def _read_json(p: str) -> pa.Table:
    try:
        return pjson.read_json(p)
    except pa.ArrowInvalid as e:
        line, why = _find_bad_json_line(p)
        if line is None:
            raise DataError(f"{p}: cannot read JSON lines: {e}") from e
        raise DataError(f"{p}: line {line}: invalid JSON line: {why}") from e


def _find_bad_json_line(p: str):
    """First line that is not a JSON object (1-based), and why."""
    with pa.input_stream(p, compression="detect") as raw:
        data = raw.read()
    for i, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            return i, f"{e.msg} (column {e.colno}): {line[:200]!r}"
        if not isinstance(obj, dict):
            return i, f"not a JSON object: {line[:200]!r}"
    return None, None


# ---------------------------------------------------------------- helpers


def _check_header(p, file_names) -> None:
    dup = sorted(c for c, k in Counter(file_names).items() if k > 1)  # one pass: a header may have 10^5 names
    if dup:
        raise DataError(
            f"{p}: column name(s) {dup} appear more than once in the header line; a file without "
            "a header line needs its column names given (names=..., `--columns` on the command line)"
        )


def _check_columns(p, have, wanted) -> None:
    if isinstance(have, (pa.Table, pa.Schema)):
        have = have.schema.names if isinstance(have, pa.Table) else have.names
    missing = [c for c in wanted if c not in have]
    if missing:
        raise DataError(f"{p}: no column(s) {missing}; the file has {list(have)}")


def _apply_types(p, table: pa.Table, types) -> pa.Table:
    _check_columns(p, table, list(types))
    cols = {}
    for name in table.column_names:
        col = table.column(name)
        if name in types:
            t = types[name]
            t = pa.type_for_alias(t) if isinstance(t, str) else t
            try:
                col = pc.cast(col, t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataError(f"{p}: column {name!r} cannot be read as {t}: {e}") from e
        cols[name] = col
    return pa.table(cols)
