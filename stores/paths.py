"""Which files a remote caller may make the server read: only files below the data root, and the
files uploaded to the collection being filled.

A server that ingests paths sent by its callers would otherwise read any file its process can
(``/etc/passwd``, another user's notes, the server's own keys). Paths are therefore relative to a
configured root, and each one is checked after resolving symlinks, because a link inside the root
can point anywhere. Nothing here writes; the only filesystem access is resolving and listing.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Iterable, Sequence

from mia.stores.chroma import MindscapeError, validate_name
from mia.stores.settings import data_root, mia_home

ROOT_ENV = "MIA_INGEST_ROOT"


class PathError(ValueError):
    """A path the caller may not use; the message names the path, the rule and the fix."""


def ingest_root() -> Path:
    """The folder ingestion through the server reads from: ``MIA_INGEST_ROOT``, else the data root."""
    raw = os.environ.get(ROOT_ENV, "").strip()
    return Path(raw).expanduser() if raw else data_root()


def upload_root(collection: str) -> Path:
    """Where the files uploaded to ``collection`` are kept: ``$MIA_HOME/uploads/COLLECTION``.

    One folder per collection, so a caller allowed to fill a collection can make the server read
    back what was uploaded to that collection and nothing else; the name is checked first because
    it becomes part of the path.
    """
    try:
        validate_name(collection)
    except MindscapeError as exc:
        raise PathError(str(exc)) from None
    return mia_home() / "uploads" / collection


def uploads_of(collection: str) -> Path:
    """:func:`upload_root` as a root to read from: a collection nothing was uploaded to has none,
    which says more than the missing folder's path would."""
    folder = upload_root(collection)
    if not folder.is_dir():
        raise PathError(f"collection {collection!r} has no uploaded files: upload them first")
    return folder


def resolve_under(root: Path, relative: str, where: str = "the data root") -> Path:
    """The real path of ``relative`` inside ``root``, or :class:`PathError` naming the root as ``where``.

    Refused: empty or non-string paths, NUL bytes, absolute paths (POSIX, Windows drive or UNC,
    ``~``), any ``..`` component, a path that does not exist, and a path whose real location
    (after following every symlink) lies outside the real ``root``.
    """
    if not isinstance(relative, str):
        raise PathError(f"ingest path {relative!r} is not a string: give a path relative to {where}")
    if not relative.strip():
        raise PathError(f"ingest path {relative!r} is empty: give a path relative to {where}")
    if "\x00" in relative:
        raise PathError(f"ingest path {relative!r} contains a NUL byte")
    if relative.startswith("~") or PurePosixPath(relative).is_absolute() or PureWindowsPath(relative).is_absolute() \
            or PureWindowsPath(relative).drive:
        raise PathError(f"ingest path {relative!r} is absolute: give a path relative to {where}")
    if ".." in PurePosixPath(relative.replace("\\", "/")).parts:
        raise PathError(f"ingest path {relative!r} contains '..': give a path inside {where}")
    try:
        real_root = root.expanduser().resolve(strict=True)
    except OSError as exc:
        raise PathError(f"{where} ({root}) does not exist" + (f": set {ROOT_ENV} to an existing folder" if where == "the data root" else "")) from exc
    candidate = real_root / relative
    try:
        real = candidate.resolve(strict=True)
    except OSError as exc:
        raise PathError(f"ingest path {relative!r}: no such file or folder under {where}") from exc
    if not real.is_relative_to(real_root):
        raise PathError(f"ingest path {relative!r} leaves {where} through a symlink; only files under it may be read")
    return real


def files_under(root: Path, relatives: Sequence[str], suffixes: Iterable[str], where: str = "the data root") -> list[Path]:
    """Every file the given paths name, folders expanded, each checked by :func:`resolve_under`.

    A folder is expanded here rather than by the reader so that a symlink inside an allowed folder
    is checked too. Files keep the order of ``relatives`` (folders in sorted order); duplicates
    are dropped. Files with other suffixes inside folders are skipped, as ingestion would.
    """
    if not relatives:
        raise PathError(f"no ingest paths given: pass one or more paths relative to {where}")
    wanted = tuple(s.lower() for s in suffixes)
    real_root = root.expanduser().resolve()
    found: dict[Path, None] = {}
    for relative in relatives:
        path = resolve_under(root, relative, where)
        if not path.is_dir():
            found[path] = None
            continue
        matched = 0
        for entry in sorted(path.rglob("*")):
            if entry.suffix.lower() not in wanted:
                continue
            inner = resolve_under(root, str(entry.relative_to(real_root)), where)
            if inner.is_file():
                found[inner] = None
                matched += 1
        if not matched:
            raise PathError(f"ingest folder {relative!r} holds no {'/'.join(wanted)} files")
    return list(found)


def ingest_files(collection: str, paths: Sequence[str], uploads: Sequence[str], suffixes: Iterable[str]) -> list[Path]:
    """The files an ingest request names, each checked against its own root: ``paths`` under the
    data root, ``uploads`` in ``collection``'s upload folder (:func:`upload_root`).

    Two roots rather than the uploads folder inside the data root: the data root is shared and may
    be read-only, while uploads belong to the collection they were sent to.
    """
    if not paths and not uploads:
        raise PathError("no ingest paths given: pass `paths` relative to the data root or `uploads` of the collection")
    found = files_under(ingest_root(), paths, suffixes) if paths else []
    if uploads:
        found += files_under(uploads_of(collection), uploads, suffixes, f"the uploads of {collection!r}")
    return list(dict.fromkeys(found))
