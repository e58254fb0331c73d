"""The packaged chart (`helm package charts/topolet`) names no file its user lacks, and no made-up URL.

A user of the package has the chart and nothing else of topolet's repository. So in the package's
README.md, values.yaml, values.schema.json, Chart.yaml and templates/NOTES.txt every path of the
repository's layout (one that starts with a top-level folder of topolet's source, `daemonset/`,
`image/`, `tests/`, `charts/`..., or with a folder of the chart, `templates/`, `files/`) is either

- a file or folder the package holds, named from the chart's root (`templates/pod-security.yaml`,
  `files/components/`), or
- qualified as being in topolet's source: written right after the words "topolet's source," (a comma,
  then the path; a line break, with a YAML comment's `#`, may come within or after the words, and a
  backquote before the path), as in "topolet's source, `daemonset/README.md`", so that
  `grep -n "topolet's source, "` finds nearly every such reference. A qualified path must exist in the
  repository.

And no URL under github.com/topolet appears in any of its files: topolet names no public repository.
"""

from __future__ import annotations

import re
import tarfile
from pathlib import Path

import pytest

from tests.chart.helm import CHART, REPO, Helm

# The package's files a user reads: the ones above.
READ = ("README.md", "values.yaml", "values.schema.json", "Chart.yaml", "templates/NOTES.txt")
QUALIFIER = "topolet's source,"
# Within the qualifier and after it: white space (a wrapped line), a YAML comment's `#`, a backquote.
BETWEEN = re.compile(r"[\s#`]+")
# The chart's own folders, which a reference names from the chart's root.
CHART_FOLDERS = ("templates", "files")


def source_folders() -> list[str]:
    """The top-level folders of topolet's source (hidden and cache folders aside)."""
    return sorted(p.name for p in REPO.iterdir()
                  if p.is_dir() and not p.name.startswith((".", "_")) and p.name != "shared")


def path_pattern() -> re.Pattern[str]:
    """A path that starts with one of those folders or the chart's, not inside a longer word or path."""
    folders = "|".join(re.escape(f) for f in (*source_folders(), *CHART_FOLDERS))
    return re.compile(rf"(?<![\w./-])(?:{folders})/[\w./*-]*")


@pytest.fixture(scope="module")
def package(helm: Helm, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The chart as `helm package` makes it, unpacked: its root folder."""
    out = tmp_path_factory.mktemp("package")
    helm.run("package", str(CHART), "--destination", str(out))
    (archive,) = out.glob("topolet-*.tgz")
    with tarfile.open(archive) as tar:
        tar.extractall(out / "unpacked", filter="data")
    root = out / "unpacked" / "topolet"
    assert (root / "Chart.yaml").is_file()
    return root


def references(text: str) -> list[tuple[str, bool]]:
    """Every repository-layout path in `text`, with whether it is qualified as in topolet's source."""
    found = []
    for match in path_pattern().finditer(text):
        path = match.group(0).rstrip(".,")
        before = BETWEEN.sub(" ", text[max(0, match.start() - 80):match.start()]).rstrip()
        qualified = before.endswith(QUALIFIER)
        found.append((path, qualified))
    return found


def test_the_path_pattern_finds_and_qualifies() -> None:
    """The check itself: what counts as a path and as qualified (a loosened regex passes everything)."""
    text = ("See daemonset/README.md, and topolet's source, `tests/chart/`; also topolet's\n"
            "  # source,\n  # image/build.sh. Not topolet-agent/x, nor a/daemonset/y; templates/NOTES.txt;\n"
            "topolet's source: bench/ (a colon).")
    assert references(text) == [("daemonset/README.md", False), ("tests/chart/", True),
                                ("image/build.sh", True), ("templates/NOTES.txt", False), ("bench/", False)]


@pytest.mark.parametrize("name", READ)
def test_every_path_is_in_the_package_or_in_topolets_source(package: Path, name: str) -> None:
    text = (package / name).read_text()
    bad = []
    for path, qualified in references(text):
        if qualified:
            if not (REPO / path).exists():
                bad.append(f"{path}: qualified as in topolet's source, where it does not exist")
        elif not (package / path).exists():
            bad.append(f"{path}: not in the package; name the chart's file, or write \"{QUALIFIER} {path}\"")
    assert not bad, f"{name}:\n" + "\n".join(bad)


def test_no_url_names_a_topolet_repository_on_github(package: Path) -> None:
    files = [p for p in package.rglob("*") if p.is_file()]
    assert len(files) > 20
    for path in files:
        assert not re.search(r"github\.com/topolet\b", path.read_text(), re.IGNORECASE), \
            path.relative_to(package)
