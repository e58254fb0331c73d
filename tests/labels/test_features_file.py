"""The features.d sink: NFD's format, atomic replacement, write-on-change, the 64 KiB limit."""

from __future__ import annotations

import os
import stat
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from agent.labels import render_labels
from agent.labels.features_file import (
    MAX_FILE_BYTES,
    FeatureFileError,
    remove_features_file,
    render_features_file,
    write_features_file,
)

LABELS = {"topolet.io/numa.nodes": "2", "feature.node.kubernetes.io/memory-numa": "true",
          "topolet.io/empty": ""}


def read_like_nfd(path: Path) -> dict[str, str]:
    """Parse a feature file the way NFD's local source does (no expiry handling)."""
    out: dict[str, str] = {}
    for raw in path.read_text().split("\n"):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        out[key] = value if sep else "true"
    return out


def entries(folder: Path) -> list[str]:
    return sorted(os.listdir(folder))


def test_render_labels_sorted_lines() -> None:
    assert render_labels({"b/x": "1", "a/y": "2"}) == "a/y=2\nb/x=1\n"
    assert render_labels({}) == ""


def test_writes_then_skips_unchanged_then_rewrites(tmp_path: Path) -> None:
    assert write_features_file(str(tmp_path), LABELS) is True
    assert read_like_nfd(tmp_path / "topolet") == LABELS
    assert write_features_file(str(tmp_path), dict(reversed(list(LABELS.items())))) is False
    changed = {**LABELS, "topolet.io/numa.nodes": "4"}
    assert write_features_file(str(tmp_path), changed) is True
    assert read_like_nfd(tmp_path / "topolet") == changed
    assert entries(tmp_path) == ["topolet"]  # no temporary left behind


def test_file_is_world_readable(tmp_path: Path) -> None:
    write_features_file(str(tmp_path), LABELS)
    assert stat.S_IMODE((tmp_path / "topolet").stat().st_mode) == 0o644


def test_custom_name(tmp_path: Path) -> None:
    write_features_file(str(tmp_path), LABELS, name="topolet-gpu")
    assert entries(tmp_path) == ["topolet-gpu"]


def test_expiry_directive(tmp_path: Path) -> None:
    when = datetime(2030, 7, 29, 13, 22, 33, 999, tzinfo=timezone(timedelta(hours=2)))
    write_features_file(str(tmp_path), LABELS, expires=when)
    lines = (tmp_path / "topolet").read_text().splitlines()
    assert "# +expiry-time=2030-07-29T11:22:33Z" in lines
    # The directive precedes every label so it covers them all.
    first_label = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    assert lines.index("# +expiry-time=2030-07-29T11:22:33Z") < first_label
    with pytest.raises(FeatureFileError):
        write_features_file(str(tmp_path), LABELS, expires=datetime(2030, 1, 1))


def labels_of_size(size: int) -> dict[str, str]:
    """Valid labels whose feature file is exactly `size` bytes (size well above the header)."""
    labels: dict[str, str] = {}
    line = len("topolet.io/k00000=" + "v" * 63 + "\n")
    while len(render_features_file(labels).encode()) + line + 14 <= size:
        labels[f"topolet.io/k{len(labels):05d}"] = "v" * 63
    # One last line "topolet.io/<name>=<value>\n" (14 to 139 bytes) takes up the rest.
    room = size - len(render_features_file(labels).encode()) - len("topolet.io/=\n")
    name_len = min(63, room)
    labels["topolet.io/" + "z" * name_len] = "w" * (room - name_len)
    assert len(render_features_file(labels).encode()) == size
    return labels


def test_exactly_64_kib_is_written_one_byte_more_is_refused(tmp_path: Path) -> None:
    write_features_file(str(tmp_path), LABELS)
    before = (tmp_path / "topolet").read_bytes()
    with pytest.raises(FeatureFileError, match="limit"):
        write_features_file(str(tmp_path), labels_of_size(MAX_FILE_BYTES + 1))
    assert (tmp_path / "topolet").read_bytes() == before
    assert entries(tmp_path) == ["topolet"]

    assert write_features_file(str(tmp_path), labels_of_size(MAX_FILE_BYTES)) is True
    assert (tmp_path / "topolet").stat().st_size == MAX_FILE_BYTES == 65536


@pytest.mark.parametrize("labels", [
    {"topolet.io/bad value": "1"},
    {"topolet.io/k": "two words"},
    {"unprefixed": "1"},
    {"topolet.io/k": "v" * 64},
    {"topolet.io/k\nevil.io/x": "1"},
])
def test_invalid_labels_are_refused_and_nothing_written(tmp_path: Path, labels: dict[str, str]) -> None:
    with pytest.raises(FeatureFileError):
        write_features_file(str(tmp_path), labels)
    assert entries(tmp_path) == []


@pytest.mark.parametrize("name", ["", ".topolet", "a/b", "..", "x\0y"])
def test_bad_file_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(FeatureFileError):
        write_features_file(str(tmp_path), LABELS, name=name)
    assert entries(tmp_path) == []


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(FeatureFileError, match="does not exist"):
        write_features_file(str(tmp_path / "nope"), LABELS)


def test_failed_rename_keeps_old_file_and_leaves_no_temporary(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    write_features_file(str(tmp_path), LABELS)
    before = (tmp_path / "topolet").read_bytes()

    def fail(src: str, dst: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(FeatureFileError, match="No space left"):
        write_features_file(str(tmp_path), {"topolet.io/numa.nodes": "8"})
    assert (tmp_path / "topolet").read_bytes() == before
    assert entries(tmp_path) == ["topolet"]


def test_remove(tmp_path: Path) -> None:
    write_features_file(str(tmp_path), LABELS)
    assert remove_features_file(str(tmp_path)) is True
    assert remove_features_file(str(tmp_path)) is False
    assert entries(tmp_path) == []
