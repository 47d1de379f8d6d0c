"""Reading (and creating) the shared secret file (docs/contract.md, section 1).  It is read as
fastpath reads it (fastpath.options.secret_key), with this module's error and fix."""
import contextlib
import os
import secrets

from fastpath.options import read_secret as _read_secret, secret_key

_WRONG_LENGTH = ("{path}: the secret must be {low}..{high} bytes, found {length}; "
                 "`manage.py fastpoll_secret --force` writes a new one")


class SecretFileError(Exception):
    pass


def parse_secret(raw, path="<secret>"):
    return secret_key(raw, path, SecretFileError, _WRONG_LENGTH)


def read_secret(path):
    return _read_secret(path, SecretFileError, _WRONG_LENGTH)


def new_secret():
    """A fresh secret as the file holds it: 64 hex digits (256 random bits) and a newline."""
    return secrets.token_hex(32).encode("ascii") + b"\n"


def ensure_secret(path):
    """Create ``path`` with a fresh secret (mode 0600) unless it exists; return the key bytes."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_secret(path)
    with os.fdopen(fd, "wb") as fh:
        fh.write(new_secret())
    return read_secret(path)


def write_secret(path, force=False):
    """Write a fresh secret to ``path`` (mode 0600; its directory must exist).  An existing file
    is kept (FileExistsError) unless ``force``: then it is replaced at once (rename), so a reader
    never sees half a secret.  OSError for the rest (permissions, no directory)."""
    if not force:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(new_secret())
        return
    temp = f"{path}.{secrets.token_hex(4)}.tmp"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(new_secret())
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
