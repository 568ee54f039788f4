"""No dead ends in a clone: every reference a tracked text file makes resolves inside the repository.

Four checks, each a small function over one file's lines that returns ``path:line: what (offending text)`` strings:

1. ``external_citations``: a citation of something a clone does not have: the background notes (``mempo.md``,
   ``environment.md``, ``architecture.md`` by bare name), ``docs/reviews/``, ``shared/docs``, or an issue of this
   project's tracker (``issue 23``, ``issues 40 and 41``, ``issue #5``, a bare ``#3696``), or an external review's
   finding by its label (``Review B2``). Another project's issue may be cited as its full URL
   (``https://github.com/OWNER/REPO/issues/N`` does not match).
2. ``missing_paths``: a token that starts with a tracked top-level folder (``mempo/``, ``tests/``, ...) and ends in a
   file suffix or a slash, after trailing punctuation and ``:line`` / ``::node`` suffixes are cut off, that names no
   tracked file or folder. Tokens with placeholders and the outputs in ``OUTPUT_PATHS`` are skipped.
3. ``missing_sections``: ``docs/algorithm.md §N`` (or ``§N-M``) where §N is not a heading of docs/algorithm.md; inside
   docs/algorithm.md every ``§N`` counts.
4. ``broken_links``: in markdown, a relative link ``[text](path)`` / ``[text](path#anchor)`` / ``[text](#anchor)``
   whose file is not tracked or whose anchor is no heading's GitHub anchor in that file.

``test_repository_has_no_dead_references`` runs them over ``git ls-files``; the other tests plant each kind of dead
reference in a temporary tree and watch its check catch it (and leave a live one alone).
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".sh", ".txt", ".cfg"}
TOP_FOLDERS = ("mempo", "tests", "docs", "experiments", "benchmarks", "scripts", ".ci")
ALGORITHM = "docs/algorithm.md"
# Paths under a tracked folder that are outputs by construction: written by a command, never committed. An entry
# ending in '/' covers everything under it.
OUTPUT_PATHS = (
    "benchmarks/results/",  # python -m benchmarks.run and its sections write here (.gitignore: benchmarks/results/*)
)
PLACEHOLDERS = ("<", "{", "*", "NAME", "...", "$", "\\")  # "\\": a regex, not a path

Finding = str
Check = Callable[[str, list[str], "Repo"], list[Finding]]


class Repo:
    """The tracked files of a tree (paths relative to its root, '/'-separated) and their folders."""

    def __init__(self, root: Path, files: Iterable[str]) -> None:
        self.root = root
        self.files = set(files)
        self.folders = {"/".join(f.split("/")[:i]) + "/" for f in self.files for i in range(1, f.count("/") + 1)}

    def has(self, path: str) -> bool:
        return path in self.folders if path.endswith("/") else path in self.files

    def lines(self, path: str) -> list[str]:
        return (self.root / path).read_text(encoding="utf-8").splitlines()


def is_text(path: str) -> bool:
    """The files the checks read: the text suffixes, and files without one (``.ci/run``, ``LICENSE``)."""
    return Path(path).suffix in TEXT_SUFFIXES | {""}


# ---- 1. citations of what a clone does not have ------------------------------------------------------------------

EXTERNAL = re.compile(
    r"(?<![\w/.-])(?:mempo|environment|architecture)\.md"  # the background notes, by bare name
    r"|docs/reviews/|shared/docs"
    r"|\bissues?\s+#?\d+"  # this project's tracker: issue 23, issues 40 and 41, issue #5
    r"|\breview [A-D]\d"  # a finding of an external review by its label (Review B2)
    r"|(?<![\w/&#])#\d{3,}\b",  # a bare issue number (#3696): cite another project's issue by its URL
    re.IGNORECASE,
)


def external_citations(path: str, lines: list[str], repo: Repo) -> list[Finding]:
    return [f"{path}:{i}: cites outside the repository ({m.group(0)!r})" for i, m in _matches(EXTERNAL, lines)]


# ---- 2. repository paths that do not exist -----------------------------------------------------------------------

PATH_TOKEN = re.compile(r"(?<![\w./-])(?:" + "|".join(re.escape(f) for f in TOP_FOLDERS) + r")/[^\s`'\"()\[\],;|]*")
LINE_SUFFIX = re.compile(r"(?:::[\w\[\]-]+)+$|(?::\d+(?:-\d+)?)+$")
FILE_SUFFIX = re.compile(r"\.[A-Za-z0-9]+$")


def path_of(token: str) -> str | None:
    """A path token -> the repository path it names, or None when it names none (no file suffix, no slash at its
    end) or holds a placeholder."""
    if any(p in token for p in PLACEHOLDERS):
        return None
    token = token.split("#")[0].rstrip(".,:;!?")
    token = LINE_SUFFIX.sub("", token).rstrip(".,:;!?")
    if token.endswith("/") or FILE_SUFFIX.search(token):
        return token
    return None


def missing_paths(path: str, lines: list[str], repo: Repo) -> list[Finding]:
    out = []
    for i, m in _matches(PATH_TOKEN, lines):
        named = path_of(m.group(0))
        if named is not None and not named.startswith(OUTPUT_PATHS) and not repo.has(named):
            out.append(f"{path}:{i}: no such path in the repository ({named!r})")
    return out


# ---- 3. sections of docs/algorithm.md ----------------------------------------------------------------------------

SECTION_CITE = re.compile(r"docs/algorithm\.md\s*§\s*(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")
SECTION_ANY = re.compile(r"§\s*(\d+(?:\.\d+)?)(?:\s*-\s*(\d+(?:\.\d+)?))?")
SECTION_HEADING = re.compile(r"^#{1,6}\s+§(\d+(?:\.\d+)?)\.?\s")


def algorithm_sections(repo: Repo) -> set[str]:
    """The §N of docs/algorithm.md's headings (``## §3. Advantages`` -> "3")."""
    if ALGORITHM not in repo.files:
        return set()
    return {m.group(1) for line in _prose(repo.lines(ALGORITHM)) if (m := SECTION_HEADING.match(line))}


def missing_sections(path: str, lines: list[str], repo: Repo) -> list[Finding]:
    own = path == ALGORITHM  # inside docs/algorithm.md a bare §N (outside ``` fences) refers to it too
    pattern, text = (SECTION_ANY, _prose(lines, keep_lines=True)) if own else (SECTION_CITE, lines)
    sections = algorithm_sections(repo)
    out = []
    for i, m in _matches(pattern, text):
        for n in filter(None, m.groups()):
            if n not in sections:
                out.append(f"{path}:{i}: {ALGORITHM} has no §{n} ({m.group(0)!r})")
    return out


# ---- 4. relative links in markdown -------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(\s*([^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lowercase, every character but letters, digits, '_', '-' and ' ' dropped,
    spaces to '-'."""
    return "".join(c for c in heading.lower() if c.isalnum() or c in "_- ").replace(" ", "-")


def anchors(lines: list[str]) -> set[str]:
    """Every heading's anchor; a repeated one also as anchor-1, anchor-2, ... (GitHub's rule)."""
    seen: dict[str, int] = {}
    out = set()
    for line in _prose(lines):
        if m := HEADING.match(line):
            a = github_anchor(m.group(1))
            out.add(a if a not in seen else f"{a}-{seen[a]}")
            seen[a] = seen.get(a, 0) + 1
    return out


def broken_links(path: str, lines: list[str], repo: Repo) -> list[Finding]:
    if not path.endswith(".md"):
        return []
    out = []
    for i, m in _matches(LINK, _prose(lines, keep_lines=True)):
        target = m.group(1)
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        file, _, anchor = target.partition("#")
        resolved = _normalize(str(Path(path).parent / file)) if file else path
        if not (repo.has(resolved) or repo.has(resolved + "/")):
            out.append(f"{path}:{i}: link to a missing file ({target!r})")
        elif anchor and (not resolved.endswith(".md") or anchor not in anchors(repo.lines(resolved))):
            out.append(f"{path}:{i}: link to a missing heading ({target!r})")
    return out


# ---- running them ------------------------------------------------------------------------------------------------

CHECKS: tuple[Check, ...] = (external_citations, missing_paths, missing_sections, broken_links)


def check_tree(repo: Repo, checks: Sequence[Check] = CHECKS) -> list[Finding]:
    """Every finding of ``checks`` over the repo's text files."""
    out = []
    for path in sorted(repo.files):
        if not is_text(path) or path == "tests/test_citations.py":  # this file names dead references on purpose
            continue
        try:
            lines = repo.lines(path)
        except UnicodeDecodeError:
            continue
        found = [finding for check in checks for finding in check(path, lines, repo)]
        out += sorted(found, key=lambda finding: int(finding.split(":")[1]))  # by line; stable within one
    return out


def _matches(pattern: re.Pattern[str], lines: list[str]) -> Iterable[tuple[int, re.Match[str]]]:
    for i, line in enumerate(lines, 1):
        for m in pattern.finditer(line):
            yield i, m


def _prose(lines: list[str], *, keep_lines: bool = False) -> list[str]:
    """Markdown lines outside ``` fences (a fenced line becomes "" with ``keep_lines``, so numbers stay right)."""
    out, fenced = [], False
    for line in lines:
        fence = line.lstrip().startswith("```")
        fenced ^= fence
        if not (fence or fenced):
            out.append(line)
        elif keep_lines:
            out.append("")
    return out


def _normalize(path: str) -> str:
    parts: list[str] = []
    for p in path.split("/"):
        if p == "..":
            parts = parts[:-1]
        elif p not in ("", "."):
            parts.append(p)
    return "/".join(parts)


def tracked(root: Path) -> list[str]:
    return subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.splitlines()


# ---- the tests ---------------------------------------------------------------------------------------------------


def test_repository_has_no_dead_references() -> None:
    findings = check_tree(Repo(ROOT, tracked(ROOT)))
    assert not findings, f"{len(findings)} dead references:\n" + "\n".join(findings)


def tree(root: Path, files: dict[str, str]) -> Repo:
    """A temporary tree of ``files`` (path -> text), all of them tracked."""
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text, encoding="utf-8")
    return Repo(root, files)


ALGORITHM_MD = """# Algorithm

## §1. The loop

### §3.2 Memory reward

```text
## §7. fenced, not a heading
```
"""


def test_external_citations_are_caught(tmp_path: Path) -> None:
    planted = """\"\"\"Eq. 5 (mempo.md §3).

See docs/reviews/rl-signal.md and ../shared/docs/environment.md.
Measured in issue 23; studies of issues 40 and 41; Issue #5; NeMo-RL #3696; environment.md; Review B2.
Live: docs/algorithm.md §1, https://github.com/Lightning-AI/pytorch-lightning/issues/19626, the issue.
\"\"\"
"""
    assert check_tree(tree(tmp_path, {"mempo/a.py": planted}), [external_citations]) == [
        "mempo/a.py:1: cites outside the repository ('mempo.md')",
        "mempo/a.py:3: cites outside the repository ('docs/reviews/')",
        "mempo/a.py:3: cites outside the repository ('shared/docs')",
        "mempo/a.py:4: cites outside the repository ('issue 23')",
        "mempo/a.py:4: cites outside the repository ('issues 40')",
        "mempo/a.py:4: cites outside the repository ('Issue #5')",
        "mempo/a.py:4: cites outside the repository ('#3696')",
        "mempo/a.py:4: cites outside the repository ('environment.md')",
        "mempo/a.py:4: cites outside the repository ('Review B2')",
    ]


def test_missing_paths_are_caught(tmp_path: Path) -> None:
    planted = """# Dead: mempo/missing.py:12, `tests/x/test_y.py::test_z`, (docs/gone/).
# Live: mempo/a.py:1, tests/test_a.py::test_it, mempo/, mempo/<name>.py, tests/*.py, mempo/losses,
# benchmarks/results/latest.json (an output), runs/demo/x.md, /work/mempo/b.py, mempo.losses.
"""
    repo = tree(tmp_path, {"mempo/a.py": "x = 1\n", "tests/test_a.py": planted})
    assert check_tree(repo, [missing_paths]) == [
        "tests/test_a.py:1: no such path in the repository ('mempo/missing.py')",
        "tests/test_a.py:1: no such path in the repository ('tests/x/test_y.py')",
        "tests/test_a.py:1: no such path in the repository ('docs/gone/')",
    ]


def test_missing_sections_are_caught(tmp_path: Path) -> None:
    planted = "# docs/algorithm.md §1, docs/algorithm.md §3.2; docs/algorithm.md §1-3, docs/algorithm.md §7\n"
    repo = tree(tmp_path, {ALGORITHM: ALGORITHM_MD + "\nAs in §3.2 and §4.\n", "mempo/a.py": planted})
    assert check_tree(repo, [missing_sections]) == [
        f"{ALGORITHM}:11: {ALGORITHM} has no §4 ('§4')",
        f"mempo/a.py:1: {ALGORITHM} has no §3 ('docs/algorithm.md §1-3')",
        f"mempo/a.py:1: {ALGORITHM} has no §7 ('docs/algorithm.md §7')",
    ]


def test_broken_links_are_caught(tmp_path: Path) -> None:
    planted = """## Notes

## Notes

[ok](../algorithm.md#1-the-loop) [ok](../algorithm.md#32-memory-reward) [ok](#notes-1) [ok](../../mempo/)
[dead](../algorithm.md#7-fenced-not-a-heading) [dead](missing.md) [dead](#notes-2) [ok](https://x.org/y)
```
[in a fence](missing.md)
```
"""
    repo = tree(tmp_path, {ALGORITHM: ALGORITHM_MD, "docs/guide/a.md": planted, "mempo/a.py": "x = 1\n"})
    assert check_tree(repo, [broken_links]) == [
        "docs/guide/a.md:6: link to a missing heading ('../algorithm.md#7-fenced-not-a-heading')",
        "docs/guide/a.md:6: link to a missing file ('missing.md')",
        "docs/guide/a.md:6: link to a missing heading ('#notes-2')",
    ]


def test_github_anchor() -> None:
    """Anchors as GitHub writes them (the README's link to docs/results.md#3-headline-... is one)."""
    assert github_anchor("§3. Advantages") == "3-advantages"
    assert github_anchor("3. Headline: MemPO vs GRPO as N grows") == "3-headline-mempo-vs-grpo-as-n-grows"
    assert github_anchor("Run `+exp=headline_quick` (a smoke test)") == "run-expheadline_quick-a-smoke-test"
