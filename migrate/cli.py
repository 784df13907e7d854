"""``hvdk8s migrate``: print (or write) the Horovod Keras 2 -> hvdk8s Keras 3 rewrite of scripts.

Exit status: 0 when nothing is left to do by hand, 1 when manual items remain (listed on
stderr as ``file:line: manual: ...``), 2 on bad input (missing file, syntax error, a file it cannot write).
"""
from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import os
import sys
import tokenize
from pathlib import Path

from hvdk8s.common.atomic import atomic_path
from hvdk8s.common.errors import UserError

MANUAL_EXIT = 1


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "migrate",
        help="rewrite a Horovod Keras 2 script for hvdk8s on Keras 3 (prints a diff)",
        description="Rewrite the mechanical Horovod -> hvdk8s and Keras 2 -> 3 changes, keeping comments and "
        "formatting. Prints a unified diff (or writes the files with --write) and lists on stderr what it "
        "could not rewrite, with the Keras 3 code to use. Exit status: 0 nothing left to do by hand, "
        "1 manual items remain, 2 bad input.",
    )
    parser.add_argument("scripts", nargs="+", metavar="script.py", help="Python files to migrate")
    parser.add_argument("--write", action="store_true", help="replace the files in place (atomically)")
    parser.set_defaults(handler=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    try:  # here, not at the top: libcst is an optional extra, and the command line registers this command without it
        from hvdk8s.migrate.codemod import migrate_source
    except ModuleNotFoundError as err:
        if err.name != "libcst":
            raise
        raise UserError("needs libcst, an optional extra: pip install 'hvdk8s[migrate]'") from None
    sources: dict[str, str] = {}
    encodings: dict[str, str] = {}
    for path in args.scripts:  # every file is checked before any is written
        sources[path], encodings[path] = _read(path)
    results = {}
    for path, source in sources.items():
        try:
            results[path] = migrate_source(source, path)
        except SyntaxError as err:
            raise UserError(f"{path}:{err.lineno}: syntax error: {err.msg}; migrate reads Python 3 code") from None
    # in each file's own encoding (codemod writes ASCII); a BOM (utf-8-sig) is written back
    changed = {path: result.code.encode(encodings[path]) for path, result in results.items()
               if result.code != sources[path]}
    if args.write:
        _write_all(changed)
    manual = False
    for path, result in results.items():
        if path in changed:
            if args.write:
                print(f"{path}: rewritten", file=sys.stderr)
            else:
                old = sources[path].encode(encodings[path])  # the file's bytes, so that patch applies the diff
                sys.stdout.flush()
                sys.stdout.buffer.writelines(difflib.diff_bytes(
                    difflib.unified_diff, old.splitlines(keepends=True), changed[path].splitlines(keepends=True),
                    os.fsencode(path), os.fsencode(path)))  # fmt: skip
        for finding in result.findings:
            kind = "manual" if finding.manual else "note"
            print(f"{path}:{finding.line}: {kind}: {finding.message}", file=sys.stderr)
        manual |= result.manual
    return MANUAL_EXIT if manual else 0


def _write_all(codes: dict[str, bytes]) -> None:
    """Replace each file atomically, keeping its mode; every new version is on disk before the first rename."""
    path = ""
    try:
        with contextlib.ExitStack() as renames:  # each atomic_path renames its temporary when the stack closes
            for path, code in codes.items():
                tmp = renames.enter_context(atomic_path(path))
                tmp.write_bytes(code)
                tmp.chmod(Path(path).stat().st_mode)  # a script's executable bit survives
    except OSError as err:
        # a failed rename names its target second (os.replace); anything else failed on the file being written
        raise UserError(f"{err.filename2 or path}: cannot write: {err.strerror or err}") from None


def _read(path: str) -> tuple[str, str]:
    """A script's text and its encoding, as Python reads it (``tokenize.detect_encoding``): UTF-8 after a BOM
    (``utf-8-sig``, which writes the BOM back), else a PEP 263 coding cookie's, else UTF-8; CRLF stays CRLF."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as err:
        raise UserError(f"{path}: cannot read: {err}") from None
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as err:  # an unknown encoding, a cookie other than utf-8 after a BOM, a first line not UTF-8
        raise UserError(f"{path}: cannot read: {err.msg}") from None
    try:
        return data.decode(encoding), encoding
    except UnicodeDecodeError as err:  # err.object: the bytes decoded (after a BOM), which err.start counts in
        line = err.object.count(b"\n", 0, err.start) + 1
        raise UserError(f"{path}:{line}: cannot read: byte 0x{err.object[err.start]:02x} is not {encoding} "
                        f"({err.reason}); "
                        "Python reads a file as UTF-8 unless a coding cookie (PEP 263) names its encoding") from None
