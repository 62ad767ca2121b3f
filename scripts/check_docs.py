#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0 WITH LLVM-exception
"""Checks mlacp's documentation (stdlib only; ctest test_docs, label docs).

usage: check_docs.py [REPO_ROOT]   (default: the directory above this script; exit 0 when every check passes)

1. Every relative link or image in README.md and docs/*.md points to a file that exists, and every `#anchor` into a
   Markdown file (or into the same file) names one of its headings, slugged as GitHub does: lowercase, punctuation
   dropped except '-' and '_', spaces to '-', a repeated heading's slug suffixed -1, -2, ... Links inside code
   (fenced blocks, inline code spans) and absolute URLs are not checked.
2. No file under include/, src/, unit_tests/, perf_tests/, python/, scripts/, examples/, cmake/ (nor a CMakeLists.txt)
   cites the numerical contract by its name outside the repository: code cites docs/spec.md, which a clone has.
3. README.md is at most 260 lines: it is the front page, and the rest belongs in docs/.

Each failure is printed as FILE:LINE: what is wrong; the exit status is 1 if there was any.
"""
import os
import pathlib
import re
import sys
import urllib.parse

README_MAX_LINES = 260
CODE_DIRS = ("include", "src", "unit_tests", "perf_tests", "python", "scripts", "examples", "cmake")
# Spelled in two parts so that this file does not match its own check.
OUTSIDE_SPEC_NAME = "MLA_" + "SPEC"
SKIP_DIRS = {"__pycache__", ".git"}

# [text](target) or ![alt](target), target optionally in <...> and followed by a "title".
INLINE_LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


def outside_code(lines):
    """(line number, text) of the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(lines, 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if m and m.group(1).startswith(fence):
                fence = None
            continue
        yield number, line


def strip_code_lines(lines):
    """(line number, text) of the lines outside fenced code blocks, with inline code spans blanked."""
    for number, line in outside_code(lines):
        yield number, INLINE_CODE.sub(lambda c: " " * len(c.group(0)), line)


def slug(text):
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w keeps letters, digits and '_' (Unicode letters too, as GitHub does)
    return text.replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    """The heading anchors of a Markdown file."""
    if path not in _anchor_cache:
        seen = {}
        result = set()
        for _, line in outside_code(path.read_text(encoding="utf-8").splitlines()):
            h = HEADING.match(line)
            if not h:
                continue
            base = slug(h.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            result.add(base if n == 0 else f"{base}-{n}")
        _anchor_cache[path] = result
    return _anchor_cache[path]


def check_links(root, md, errors):
    lines = md.read_text(encoding="utf-8").splitlines()
    for number, line in strip_code_lines(lines):
        targets = [m.group(1) for m in INLINE_LINK.finditer(line)]
        d = REFERENCE_DEF.match(line)
        if d:
            targets.append(d.group(1))
        for target in targets:
            if target.startswith("<") and target.endswith(">"):
                target = target[1:-1]
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # an absolute URL (http:, https:, mailto:, ...)
            where = f"{md.relative_to(root)}:{number}"
            path_part, _, anchor = target.partition("#")
            path_part = urllib.parse.unquote(path_part)
            dest = md if not path_part else (md.parent / path_part).resolve()
            if not dest.exists():
                shown = dest.relative_to(root) if dest.is_relative_to(root) else dest
                errors.append(f"{where}: link to '{target}': no such file {shown}")
                continue
            if anchor and dest.is_file() and dest.suffix.lower() == ".md":
                if urllib.parse.unquote(anchor) not in anchors(dest):
                    errors.append(f"{where}: link to '{target}': {dest.relative_to(root)} has no heading "
                                  f"with the anchor #{anchor}")


def source_files(root):
    """The files of CODE_DIRS and every CMakeLists.txt, outside build trees, .git and __pycache__."""
    files = set()
    for dirpath, dirnames, filenames in os.walk(root):
        rel = pathlib.Path(dirpath).relative_to(root)
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not (rel == pathlib.Path(".") and
                                                                         (d.startswith("build") or d.startswith(".")))]
        in_code = rel.parts and rel.parts[0] in CODE_DIRS
        for name in filenames:
            if in_code or name == "CMakeLists.txt":
                files.add(pathlib.Path(dirpath) / name)
    return sorted(files)


def check_code_citations(root, errors):
    for path in source_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary files
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE_SPEC_NAME in line:
                errors.append(f"{path.relative_to(root)}:{number}: cites {OUTSIDE_SPEC_NAME}, which is not in the "
                              f"repository; cite docs/spec.md (same section names)")


def main(argv):
    root = pathlib.Path(argv[1] if len(argv) > 1 else pathlib.Path(__file__).resolve().parent.parent).resolve()
    errors = []
    readme = root / "README.md"
    pages = [readme] + sorted((root / "docs").glob("*.md"))
    for md in pages:
        if md.is_file():
            check_links(root, md, errors)
        else:
            errors.append(f"{md.relative_to(root)}:0: missing")
    check_code_citations(root, errors)
    if readme.is_file():
        count = len(readme.read_text(encoding="utf-8").splitlines())
        if count > README_MAX_LINES:
            errors.append(f"README.md:{count}: {count} lines; the front page is at most {README_MAX_LINES} lines "
                          f"(move the detail to docs/)")
    for e in errors:
        print(e)
    print(f"check_docs: {len(pages)} pages, {'FAIL' if errors else 'PASS'} ({len(errors)} problem(s))")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
