#!/usr/bin/python3
"""The shape the code promises (docs/architecture.md): no function over 120
lines in server/ or client/ outside the data tables named below, and the
files that had many jobs (the store writer, the MoE rules) under 450 lines.

A function is found by its signature at the start of a line (indented at
most 4: namespace scope or a class body) and its body up to its matching
brace; lambdas and nested blocks count with their function.

    /usr/bin/python3 tests/deploy/source_shape_test.py REPO
"""

import pathlib
import re
import sys

MAX_FUNCTION_LINES = 120
MAX_FILE_LINES = {"server/store/writer.cc": 450, "server/health/detectors/moe.cc": 450}
# Data tables: one line per metric or key; their length is their content.
DATA_TABLES = {
    ("server/metrics/metrics.cc", "Metrics::Metrics"),  # every metric, its name and help
    ("server/config/config_fields.cc", "Fields"),       # every config key, its tier and doc
}
SIGNATURE = re.compile(
    r"^ {0,4}(?!(?:if|for|while|switch|return|else|case|do|namespace|class|struct|enum|"
    r"using|typedef|template|static_assert)\b)[A-Za-z_~][^;=(]*\(")
NAME = re.compile(r"([A-Za-z_~][\w:~]*)\s*\(")
LITERAL = re.compile(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'')


def code(line):
    """The line without its literals and // comment (braces in them do not
    count)."""
    return LITERAL.sub('""', line).split("//", 1)[0]


def body_start(lines, i):
    """(line, column) of the function body's '{' for the signature at line
    i: the first brace outside parentheses that is not a member's brace
    initialiser (`x_{1}`); None if a ';' comes first (a declaration)."""
    depth = 0
    for j in range(i, min(i + 400, len(lines))):
        c = code(lines[j])
        for col, ch in enumerate(c):
            if ch == "(":
                depth += 1
            elif ch == ")":
                depth -= 1
            elif depth == 0 and ch == ";":
                return None
            elif depth == 0 and ch == "{":
                before = c[:col].rstrip()
                word = re.search(r"(\w+)$", before)
                if before and (before[-1] in ")>" or (word and word.group(1) in QUALIFIERS)
                               or before.endswith("->")):
                    return j, col
                if not before or not (before[-1].isalnum() or before[-1] == "_"):
                    return j, col
    return None


QUALIFIERS = {"const", "override", "noexcept", "final", "mutable"}


def functions(path):
    """[(name, first line, lines)] of the functions defined in path: a
    signature, to its body's matching brace."""
    lines = path.read_text(errors="replace").split("\n")
    out, i = [], 0
    while i < len(lines):
        if not SIGNATURE.match(lines[i]) or lines[i].lstrip().startswith(("//", "#")):
            i += 1
            continue
        found = NAME.search(lines[i])
        name = found.group(1) if found else lines[i].strip()[:40]
        start = body_start(lines, i)
        if start is None:
            i += 1
            continue
        j, col = start
        depth, k = 0, j
        c = code(lines[j])[col:]
        while True:
            depth += c.count("{") - c.count("}")
            if depth <= 0 or k + 1 >= len(lines):
                break
            k += 1
            c = code(lines[k])
        out.append((name, i + 1, k - i + 1))
        i = k + 1
    return out


def main(repo):
    repo = pathlib.Path(repo)
    failures = []
    for top in ("server", "client"):
        for path in sorted((repo / top).rglob("*")):
            if path.suffix not in (".cc", ".h") or not path.is_file():
                continue
            rel = path.relative_to(repo).as_posix()
            for name, line, n in functions(path):
                if n > MAX_FUNCTION_LINES and (rel, name) not in DATA_TABLES:
                    failures.append(f"{rel}:{line}: {name} is {n} lines (at most "
                                    f"{MAX_FUNCTION_LINES} outside data tables)")
    for rel, limit in MAX_FILE_LINES.items():
        n = len((repo / rel).read_text().split("\n")) - 1
        if n >= limit:
            failures.append(f"{rel} is {n} lines (under {limit})")
    # The finder itself: it must see the data tables it exempts (else the
    # exemption would hide nothing and the finder be blind).
    for rel, name in DATA_TABLES:
        found = [n for f, _, n in functions(repo / rel) if f == name]
        if not found or max(found) <= MAX_FUNCTION_LINES:
            failures.append(f"{rel}: the finder did not see {name} as a long function")
    for f in failures:
        print("FAIL", f)
    print(f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
