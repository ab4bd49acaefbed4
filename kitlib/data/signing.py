"""The key that says "this machine wrote it" (an HMAC key kept outside the cache folder): only signed pickles are
unpickled, so a planted or copied-in one is refused."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

CONFIG_ENV = "KITLIB_CONFIG_DIR"
KEY_FILE = "cache.key"


def config_dir() -> Path:
    if os.environ.get(CONFIG_ENV):
        return Path(os.environ[CONFIG_ENV]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or "~/.config"
    return Path(base).expanduser() / "kitlib"


def signing_key() -> bytes:
    """This user's key (32 random bytes, created on first use, readable by the user only)."""
    path = config_dir() / KEY_FILE
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_bytes(32)
    try:  # O_EXCL: two processes creating it at once agree on the first one's key
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes()
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    return key


def sign(records: Mapping[str, Any]) -> str:
    """HMAC-SHA256 over the files' {"bytes", "sha256"} records: with each file's sha256 checked on read, this
    authenticates every byte of the entry."""
    message = json.dumps(records, sort_keys=True).encode()
    return hmac.new(signing_key(), message, hashlib.sha256).hexdigest()


def is_signed(records: Mapping[str, Any], signature: object) -> bool:
    return isinstance(signature, str) and hmac.compare_digest(sign(records), signature)
