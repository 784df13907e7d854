"""Atomic file and folder writes: a reader (``kubectl``, TF Serving's poller, a resuming job) never sees half of one.

Everything is written under a hidden temporary name beside the target, flushed to disk, then renamed
onto it in one step; on any error the temporary goes and the target is as it was. Files get the mode
``open()`` would give them (``mkstemp``'s 0600 would hide them from other readers, e.g. a server
running as another user). This module imports nothing of hvdk8s, so every layer can use it.
"""
from __future__ import annotations

import ctypes
import errno
import functools
import json
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TEMP_PREFIX = ".tmp-"
"""Every temporary starts with this (and is hidden), so a cleaner can tell them from real files."""
_AT_FDCWD = -100  # <fcntl.h>, Linux
_RENAME_NOREPLACE = 1  # <linux/fs.h>


@contextmanager
def atomic_path(path: str | os.PathLike[str], *, temporary: str | None = None) -> Iterator[Path]:
    """A temporary file beside ``path`` (same suffix, so writers that check it accept it) to write to.

    Renamed onto ``path`` when the block ends, removed if it raises. Missing folders are made.
    ``temporary`` names the temporary (it must start with ``TEMP_PREFIX``) when a cleaner has to
    recognise whose it is, as the checkpoints' does; by default the name is unique and random.
    A symbolic link is followed: its target is replaced and the link stays. A folder, or anything
    else that is not a regular file (a device, a FIFO: ``/dev/stdout``), is refused before anything
    is written (``OSError`` naming ``path``): a rename would replace it.
    """
    final = Path(os.path.realpath(path))
    if final.is_dir():
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), os.fspath(path))
    if final.exists() and not final.is_file():
        raise OSError(errno.EINVAL, "not a regular file, which a write here would replace", os.fspath(path))
    _make_parent(final)
    if temporary is None:
        tmp = _create_unique(final.parent, f"{TEMP_PREFIX}{final.stem}-", final.suffix, _create_file)
    else:
        if not temporary.startswith(TEMP_PREFIX) or "/" in temporary:
            raise ValueError(f"temporary {temporary!r}: must be a file name starting with {TEMP_PREFIX!r}")
        tmp = final.parent / temporary
        _create_file(tmp)
    try:
        yield tmp
        _fsync(tmp)
        os.replace(tmp, final)
        _fsync(final.parent)
    finally:
        tmp.unlink(missing_ok=True)


@contextmanager
def atomic_directory(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A temporary folder beside ``path`` to fill, renamed to ``path`` when the block ends.

    Its files and folders are flushed to disk first, so ``path`` never appears with truncated files after a
    crash. The rename fails (``FileExistsError``) if ``path`` exists, even as an empty folder, which a plain
    ``rename(2)`` would replace: two writers never merge into one folder, nor does one replace the other's.
    """
    final = Path(path)
    _make_parent(final)
    tmp = _create_unique(final.parent, f"{TEMP_PREFIX}{final.name}-", "", lambda p: os.mkdir(p, 0o777))
    try:
        yield tmp
        _fsync_tree(tmp)
        _rename_new(tmp, final)
        _fsync(final.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Replace ``path`` with ``data`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Replace ``path`` with ``text`` (UTF-8) atomically."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: str | os.PathLike[str], data: Any) -> Path:
    """Replace ``path`` with ``data`` as indented JSON atomically."""
    return write_text(path, json.dumps(data, indent=1) + "\n")


def _make_parent(path: Path) -> None:
    for folder in (path.parent, *path.parent.parents):
        if folder.exists():
            if not folder.is_dir():  # mkdir would say "File exists", which misleads
                raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder))
            break
    path.parent.mkdir(parents=True, exist_ok=True)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Every regular file and folder under ``root`` (not symlinks, nor FIFOs, which open would block on)."""
    for folder, _folders, files in os.walk(root):
        for name in files:
            file = Path(folder, name)
            if file.is_file() and not file.is_symlink():
                _fsync(file)
        _fsync(Path(folder))


def _rename_new(src: Path, dst: Path) -> None:
    """Rename ``src`` to ``dst``, which must not exist: ``FileExistsError`` otherwise, even for an empty folder.

    Linux's ``renameat2(RENAME_NOREPLACE)`` checks and renames in one step. Where it is missing (not Linux,
    glibc before 2.28) or refused (ENOSYS: an old kernel; EINVAL: a file system without the flag; EPERM: an
    old container seccomp profile), ``dst`` is checked right before ``os.rename``, which leaves only that
    instant for another writer's empty folder to be replaced.
    """
    renameat2 = _renameat2()
    if renameat2 is not None:
        if renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), str(dst))
        if code not in (errno.ENOSYS, errno.EINVAL, errno.EPERM):
            raise OSError(code, os.strerror(code), str(src), None, str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(dst))
    os.rename(src, dst)


@functools.cache
def _renameat2() -> Callable[..., int] | None:
    """The C library's ``renameat2``, or None where it has none."""
    return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)


def _create_file(path: Path) -> None:
    """Create ``path`` empty, failing if it exists; the umask applies, as for ``open()``."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))


def _create_unique(folder: Path, prefix: str, suffix: str, create: Callable[[Path], None]) -> Path:
    """``folder/prefix<random>suffix``, created by ``create`` (which raises ``FileExistsError`` on a clash)."""
    while True:
        path = folder / f"{prefix}{secrets.token_hex(4)}{suffix}"
        try:
            create(path)
            return path
        except FileExistsError:
            continue
