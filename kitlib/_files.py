"""Never half-written files (``write_atomic``) and the manifest, written last, proving a folder is complete."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, TypedDict

from kitlib.errors import DiskFullError


class FileRecord(TypedDict):
    bytes: int
    sha256: str


class FileMismatch(ValueError):
    """A file does not match its manifest record: missing, truncated/replaced (size) or corrupted (sha256)."""


def fsync_file(path: Path) -> None:
    """Flush a written file to disk, so a rename can never publish bytes that are still only in the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make renames inside ``path`` durable across power loss; some FUSE mounts (Colab Drive) refuse it: skipped."""
    with contextlib.suppress(OSError):
        fsync_file(path)


# "this write does not fit here": disk full, quota exceeded, a file over FAT32's 4 GB or ulimit -f
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def free_bytes(path: Path) -> tuple[int, Path]:
    """Free bytes on the filesystem that holds ``path`` (or its nearest existing parent), and that parent."""
    existing = next((p for p in (path, *path.parents) if p.is_dir()), Path("/"))
    return shutil.disk_usage(existing).free, existing


@contextlib.contextmanager
def explain_disk_full(path: Path, what: str) -> Iterator[None]:
    """ "No space left on device" writing ``what`` to ``path`` as one message with the file, free space and fix."""
    try:
        yield
    except Exception as err:
        # safetensors' writer (Rust) raises its own SafetensorError holding the OS's words: "... (os error 27)"
        code = err.errno if isinstance(err, OSError) else int(m[1]) if (m := _OS_ERROR.search(str(err))) else None
        if code not in NO_SPACE:
            raise
        free, where = free_bytes(path)
        raise DiskFullError(
            f"no space left writing {what} {path} ({free / 1e9:.2f} GB free on {where}; {os.strerror(code)}); nothing "
            "was replaced, the previous version is intact. Fix: free space (delete run.prev/ or old runs; python -m "
            "kitlib cache clear for the feature cache) or point work_dir at a bigger disk (for 'File too large': one "
            "without a file-size limit, e.g. not FAT32, or raise ulimit -f)"
        ) from err


def write_atomic(path: str | os.PathLike[str], content: str | bytes | memoryview | Callable[[BinaryIO], None]) -> Path:
    """Write ``content`` (text, bytes, or a binary writer) to ``path`` atomically; one fsync of file and folder."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with explain_disk_full(target, "file"), os.fdopen(fd, "wb") as fh:
            if callable(content):
                content(fh)
            else:
                fh.write(content.encode() if isinstance(content, str) else content)
            fh.flush()
            os.fsync(fh.fileno())  # the rename must not publish bytes that are still only in the page cache
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(target.parent)
    return target


def write_recorded(path: Path, chunks: Iterable[bytes | memoryview]) -> FileRecord:
    """Write ``chunks`` to a new file, hashing as it goes; unbuffered (each large chunk is one write(2), no copy)."""
    digest, size = hashlib.sha256(), 0
    with path.open("wb", buffering=0) as f:
        for chunk in chunks:
            f.write(chunk)
            digest.update(chunk)
            size += len(chunk)
        os.fsync(f.fileno())
    return {"bytes": size, "sha256": digest.hexdigest()}


def record_bytes(data: bytes | bytearray | memoryview) -> FileRecord:
    return {"bytes": memoryview(data).nbytes, "sha256": hashlib.sha256(data).hexdigest()}


def record_file(path: Path) -> FileRecord:
    digest = hashlib.sha256()  # (hashlib.file_digest is 3.11+; kitlib supports 3.10)
    with path.open("rb") as f:  # usually just written: read back from the page cache
        for chunk in iter(lambda: f.read(1 << 22), b""):
            digest.update(chunk)
    return {"bytes": path.stat().st_size, "sha256": digest.hexdigest()}


def nbytes(obj: Any) -> int:
    """Bytes of the tensors/arrays in ``obj`` and its nested dicts, lists, tuples and sets (what writing it costs)."""
    if isinstance(obj, Mapping):
        return sum(nbytes(v) for v in obj.values())
    if isinstance(obj, list | tuple | set):
        return sum(nbytes(v) for v in obj)
    return int(getattr(obj, "nbytes", 0))  # torch.Tensor and np.ndarray both say it


def check_file(path: Path, record: Mapping[str, object], *, verify: bool = True, read: bool = False) -> bytearray:
    """FileMismatch unless ``path`` has the recorded size (always) and sha256 (if ``verify``); its bytes if ``read``."""
    if not path.is_file():
        raise FileMismatch(f"{path.name} is missing")
    size = path.stat().st_size
    if size != record["bytes"]:  # a killed writer, a full disk, a partial upload: cheap to see, nothing read
        raise FileMismatch(f"{path.name} is {size} bytes, the manifest says {record['bytes']} (truncated or replaced)")
    blob = bytearray(size if read else 0)  # read once: the hash runs over these bytes, not a second disk pass
    with path.open("rb") as f:
        f.readinto(blob)
    if verify and (record_bytes(blob) if read else record_file(path))["sha256"] != record["sha256"]:
        raise FileMismatch(f"{path.name} fails its sha256 check (corrupted)")
    return blob


def read_checked(path: Path, record: Mapping[str, object]) -> bytearray:
    """The file's bytes, read once and checked against ``record``."""
    return check_file(path, record, read=True)


def write_manifest(directory: Path, manifest: Mapping[str, Any]) -> None:
    """``directory``/manifest.json, written last: its presence says every file it lists is complete."""
    write_recorded(directory / "manifest.json", [json.dumps(manifest, indent=1).encode()])


def read_manifest(directory: Path) -> dict[str, Any]:
    """``directory``/manifest.json as a dict; FileMismatch if it is missing or unreadable."""
    try:
        manifest = json.loads((directory / "manifest.json").read_bytes())
    except FileNotFoundError:
        raise FileMismatch("manifest.json is missing") from None
    except (OSError, ValueError) as err:
        raise FileMismatch(f"manifest.json is unreadable ({err})") from err
    if not isinstance(manifest, dict):
        raise FileMismatch("manifest.json is not an object")
    return manifest


def known_fields(cls: Any, saved: Mapping[str, Any]) -> dict[str, Any]:
    """``saved``'s entries that dataclass ``cls`` declares (a newer kitlib's file still reads)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in saved.items() if k in names}


def read_json_object(path: Path | None) -> dict[str, Any]:
    """A JSON object file's contents; {} when absent, damaged or not an object (its owner measures and rewrites it)."""
    try:
        data = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
