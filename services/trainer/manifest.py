"""A checkpoint's signed manifest: every file's size and sha256, with an HMAC of the run secret over them, so Load
proves a folder is one this run wrote before torch reads a byte of it (DCP's `.metadata` is a pickle)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from services.common import auth

MANIFEST = "manifest.json"
_PURPOSE = "checkpoint"
_NOT_OURS = "not written by this run (or a run holding the same secret)"


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    """Relative to the checkpoint folder, '/'-separated."""
    num_bytes: int
    sha256: str


def write_manifest(folder: Path) -> None:
    """Write folder's manifest (rank 0, once every rank's files are written), atomically: written, fsynced, renamed.
    Signed where this process holds a run secret, unsigned (hashes only) where it runs unlocked."""
    rels = [rel for rel in relative_files(folder) if rel != MANIFEST]
    files = [FileEntry(rel, (folder / rel).stat().st_size, digest) for rel, digest in zip(rels, _sha256s(folder, rels))]
    doc = {"files": [asdict(e) for e in files], "signature": auth.sign(_PURPOSE, _canonical(files)).hex()}
    tmp = folder / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    tmp.rename(folder / MANIFEST)


def verify_manifest(folder: Path, complete: Sequence[str]) -> None:
    """Refuse folder (ValueError naming what failed) unless its manifest is signed with this process's run secret and
    every listed file has its size and sha256; in the subfolders `complete` (those torch reads) a file the manifest
    does not list is refused too. Without a secret (a trainer started by hand, unlocked) the signature is not checked,
    as no call is, but the hashes still are: they cost a read of the folder and catch a damaged checkpoint."""
    files, signature = _read(folder)
    if not auth.verify(signature, _PURPOSE, _canonical(files)):
        raise ValueError(f"{folder}: the signature of its {MANIFEST} does not match: {_NOT_OURS}")
    listed = {e.path for e in files}
    for sub in complete:
        extra = [rel for rel in relative_files(folder / sub, prefix=sub) if rel not in listed]
        if extra:
            raise ValueError(f"{folder}: {extra[0]} is not listed in its {MANIFEST}: {_NOT_OURS}")
    for e in files:  # sizes first: a stat each, so a cut or grown file fails before any hashing
        if (size := _size(folder, e.path)) != e.num_bytes:
            raise ValueError(f"{folder}: {e.path} has {size} bytes, its {MANIFEST} says {e.num_bytes}: altered since")
    for e, digest in zip(files, _sha256s(folder, [e.path for e in files])):
        if digest != e.sha256:
            raise ValueError(f"{folder}: the sha256 of {e.path} differs from its {MANIFEST}'s: altered since")


def relative_files(root: Path, prefix: str = "") -> list[str]:
    """Every entry under root that is not a real folder (files, and symlinks of any kind: os.walk does not descend
    into a linked folder, so it is reported rather than skipped), as '/'-separated paths under prefix."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        links = [d for d in dirnames if (here / d).is_symlink()]
        found += [PurePosixPath(prefix, (here / n).relative_to(root).as_posix()).as_posix() for n in filenames + links]
    return sorted(found)


def _read(folder: Path) -> tuple[list[FileEntry], bytes]:
    """The manifest's entries and signature, each field checked: the file is the caller's until proven ours."""
    path = folder / MANIFEST
    if not path.is_file():
        raise ValueError(f"{folder} has no {MANIFEST}: {_NOT_OURS}, or saved before checkpoints were signed")
    try:
        doc = json.loads(path.read_bytes())
        files = [FileEntry(**e) for e in doc["files"]]
        signature = bytes.fromhex(doc["signature"])
        for e in files:
            if not (isinstance(e.path, str) and type(e.num_bytes) is int and isinstance(e.sha256, str)):
                raise ValueError(f"entry {e} has a field of the wrong type")
    except (ValueError, TypeError, KeyError) as e:  # json's errors are ValueErrors
        raise ValueError(f"{path} is malformed ({e}): {_NOT_OURS}") from None
    for e in files:
        rel = PurePosixPath(e.path)
        if rel.is_absolute() or ".." in rel.parts or not rel.parts:
            raise ValueError(f"{path} lists {e.path!r}, a path outside its folder: {_NOT_OURS}")
    return files, signature


def _canonical(files: list[FileEntry]) -> bytes:
    return json.dumps([asdict(e) for e in files], sort_keys=True, separators=(",", ":")).encode()


def _size(folder: Path, rel: str) -> int:
    try:
        return (folder / rel).stat().st_size
    except FileNotFoundError:
        raise ValueError(f"{folder}: {rel}, listed in its {MANIFEST}, is missing") from None


def _sha256s(folder: Path, rels: list[str]) -> list[str]:
    """The sha256 of each file, in order, several files at once: hashlib lets go of the GIL while it hashes, and a
    checkpoint's training state comes in one file per writer thread (checkpoint.writer_threads)."""
    workers = max(1, min(8, len(os.sched_getaffinity(0)), len(rels)))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda rel: _sha256(folder / rel), rels))


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()
