"""The NFD `features.d` file sink and the `key=value` text both it and the CLI print.

NFD's local source (docs "Customization guide", Local feature source; source/local/local.go)
reads every regular, non-dot file in its features.d folder: one `key[=value]` per line, `#`
comments, an optional `# +expiry-time=<RFC3339>` directive that expires the lines after it, and
files over 64 KiB ignored entirely.  Writers must write a dot-file and rename it into place.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime

from agent.api.validate import is_label_key, is_label_value
from agent.errors import TopoletError

MAX_FILE_BYTES = 64 * 1024  # NFD's MaxFeatureFileSize: larger files are skipped whole
DEFAULT_FEATURES_DIR = "/etc/kubernetes/node-feature-discovery/features.d"
DEFAULT_FILE_NAME = "topolet"
_HEADER = "# Written by topolet; rewritten on every discovery, do not edit.\n"


class FeatureFileError(TopoletError):
    """The feature file was refused (invalid label, too large, bad name) or could not be written."""

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{message}: {path}" if path else message)
        self.path = path


def render_labels(labels: Mapping[str, str]) -> str:
    """Sorted `key=value` lines, each ending in a newline ("" for no labels)."""
    return "".join(f"{k}={labels[k]}\n" for k in sorted(labels))


def render_features_file(labels: Mapping[str, str], *, expires: datetime | None = None) -> str:
    """The feature file text for `labels`; refuses any key or value that is not a valid label."""
    for key, value in labels.items():
        if not isinstance(key, str) or not is_label_key(key) or "/" not in key:
            raise FeatureFileError(f"not a prefixed label key: {key!r}")
        if not isinstance(value, str) or not is_label_value(value):
            raise FeatureFileError(f"not a label value for {key}: {value!r}")
    head = _HEADER
    if expires is not None:
        if expires.tzinfo is None:
            raise FeatureFileError("expiry time needs a time zone")
        stamp = expires.astimezone(UTC).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
        head += f"# +expiry-time={stamp}\n"
    return head + render_labels(labels)


def _check_name(name: str) -> None:
    # NFD skips dot-files (ours are temporaries) and reads only the folder itself.
    if not name or name.startswith(".") or "/" in name or "\0" in name or len(name) > 200:
        raise FeatureFileError(f"invalid feature file name {name!r}")


def _fsync_dir(folder: str) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_features_file(folder: str, labels: Mapping[str, str], name: str = DEFAULT_FILE_NAME, *,
                        expires: datetime | None = None) -> bool:
    """Atomically (re)write `folder/name` with `labels`; False when it already held this content.

    Nothing is written when a label is invalid, the text exceeds 64 KiB or the folder is missing.
    """
    _check_name(name)
    data = render_features_file(labels, expires=expires).encode("ascii")
    path = os.path.join(folder, name)
    if len(data) > MAX_FILE_BYTES:
        raise FeatureFileError(f"feature file would be {len(data)} bytes, over NFD's "
                               f"{MAX_FILE_BYTES}-byte limit", path)
    if not os.path.isdir(folder):
        raise FeatureFileError("features folder does not exist", folder)
    try:
        with open(path, "rb") as current:
            if current.read(MAX_FILE_BYTES + 1) == data:
                return False
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise FeatureFileError(f"cannot read the feature file ({exc.strerror})", path) from exc

    tmp = ""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), 0o644)  # nfd-worker may run as another user
            os.fsync(out.fileno())
        os.replace(tmp, path)
        tmp = ""
        _fsync_dir(folder)
    except OSError as exc:
        raise FeatureFileError(f"cannot write the feature file ({exc.strerror or exc})", path) from exc
    finally:
        if tmp:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    return True


def remove_features_file(folder: str, name: str = DEFAULT_FILE_NAME) -> bool:
    """Delete `folder/name` (labels go away at NFD's next pass); False when it was not there."""
    _check_name(name)
    path = os.path.join(folder, name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise FeatureFileError(f"cannot remove the feature file ({exc.strerror})", path) from exc
    _fsync_dir(folder)
    return True
