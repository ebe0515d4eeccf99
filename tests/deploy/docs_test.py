"""The README is the front door: short, and every relative link in it and in
docs/ resolves to a file inside the repository (no path outside it), and to
a heading of that file when it names one (#anchor). Beyond the docs, the
tree's own references must hold too: every docs/X.md a source file, script
or config names exists (and the section it names after it, `docs/X.md,
"Section"` or `docs/X.md#anchor`, is a heading there); every README section
a comment names (`README "Section"`) is a heading of the README; no comment
points at a design file outside the repository ("DESIGN.md") or at a
tracker's issue by number; and every
series the server registers (a "trainwatch_..." name in server/metrics/) is
listed in docs/metrics.md; every flag of the server's flag table
(server/server_flags.cc) is named in the README; and every C++ source file a
C++ comment names exists in the tree, and every path of the tree a doc
names."""
import os
import re
import sys

root = os.path.abspath(sys.argv[1])
failures = []

readme = os.path.join(root, "README.md")
flags_cc = os.path.join(root, "server", "server_flags.cc")
if os.path.exists(flags_cc):
    readme_text = open(readme, encoding="utf-8").read()
    flags = re.findall(r'^\s*\{"(--[a-z-]+)"', open(flags_cc, encoding="utf-8").read(), re.M)
    if len(flags) < 15:
        failures.append(f"server/server_flags.cc: only {len(flags)} flags parsed from its table")
    for flag in flags:
        if flag != "--help" and not re.search(re.escape(flag) + r"(?![a-z-])", readme_text):
            failures.append(f"README.md does not name the server flag {flag} (server/server_flags.cc)")
else:
    failures.append("server/server_flags.cc is missing: the server's flag table")
n = sum(1 for _ in open(readme, encoding="utf-8"))
if n > 250:
    failures.append(f"README.md has {n} lines; keep it under 250 (longer material goes to docs/)")

docs = [readme]
for d in ("docs", "tests/fuzz"):
    for dirpath, _, files in os.walk(os.path.join(root, d)):
        docs += [os.path.join(dirpath, f) for f in files if f.endswith(".md")]

link = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
checked = 0
for path in docs:
    text = open(path, encoding="utf-8").read()
    for target in link.findall(text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0]
        resolved = os.path.abspath(os.path.join(os.path.dirname(path), file_part))
        where = os.path.relpath(path, root)
        checked += 1
        if not resolved.startswith(root + os.sep):
            failures.append(f"{where}: link {target} leaves the repository")
        elif not os.path.exists(resolved):
            failures.append(f"{where}: link {target} points to nothing")
    if "../shared" in text:
        failures.append(f"{os.path.relpath(path, root)}: mentions ../shared, outside the repository")

def slug(heading):
    """GitHub's anchor for a heading."""
    h = heading.strip().lower()
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def headings(path):
    out = set()
    in_code = False
    for line in open(path, encoding="utf-8"):
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and line.startswith("#"):
            out.add(line.lstrip("#").strip())
    return out


# Anchors of markdown links.
for path in docs:
    text = open(path, encoding="utf-8").read()
    for target in link.findall(text):
        if re.match(r"[a-z]+:", target) or "#" not in target:
            continue
        file_part, anchor = target.split("#", 1)
        resolved = (os.path.abspath(os.path.join(os.path.dirname(path), file_part))
                    if file_part else path)
        if resolved.endswith(".md") and os.path.exists(resolved):
            checked += 1
            if anchor not in {slug(h) for h in headings(resolved)}:
                failures.append(f"{os.path.relpath(path, root)}: link {target}: no such heading")

# References from the rest of the tree.
skip_dirs = {".git", "node_modules", "corpus", "testdata", "vendor"}
suffixes = (".cc", ".h", ".py", ".sh", ".yml", ".yaml", ".txt", ".md", ".conf",
            ".proto", ".json", ".html", ".js", ".cmake")
doc_ref = re.compile(r"docs/([a-z0-9-]+\.md)(?:(#[a-z0-9-]+)|,\s+\"([^\"]+)\")?")
readme_ref = re.compile(r"README(?:\.md)?(?:'s)?\s+\(?\"([^\"]+)\"")
readme_sections = headings(readme)
tree_refs = 0
# Every path of the tree a doc names (`server/health/signals/moe_load.{h,cc}`,
# tools/lab/moe_lab.py, tests/unit/store/): a file with its extension, or a
# folder with its slash; names without either are often something else (a
# Kubernetes deploy/NAME). Braces are expanded, globs skipped.
doc_path = re.compile(r"(?<![\w./-])((?:server|client|tools|tests|deploy|dashboards|proto|docs)"
                      r"/[\w./{},*-]+)")
doc_paths = 0
for path in docs:
    for line_no, line in enumerate(open(path, encoding="utf-8"), 1):
        for m in doc_path.finditer(line):
            token = m.group(1).rstrip(".,:;")
            last = token.rstrip("/").rsplit("/", 1)[-1]
            if "*" in token or not (token.endswith("/") or "." in last):
                continue
            brace = re.search(r"\{([^}]*)\}", token)
            names = ([token[:brace.start()] + x + token[brace.end():]
                      for x in brace.group(1).split(",")] if brace else [token])
            for name in names:
                doc_paths += 1
                if not os.path.exists(os.path.join(root, name)):
                    failures.append(f"{os.path.relpath(path, root)}:{line_no}: names {name}, "
                                    "which is not in the tree")
if doc_paths < 100:
    failures.append(f"found only {doc_paths} paths named in the docs: the scan is broken")
# Every C++ source file a C++ comment names (by its name, with or without a
# folder) is a file of the tree: a comment that points at a file renamed
# long ago sends the reader nowhere. Generated headers (*.pb.h) are built.
tree_names = set()
for dirpath, dirnames, files in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root)
    dirnames[:] = [d for d in dirnames
                   if d not in skip_dirs and not (rel_dir == "." and d.startswith("build"))]
    tree_names.update(files)
source_name = re.compile(r"(?<![.\w-])([A-Za-z_0-9]+\.(?:cc|h))\b")
comment = re.compile(r"//(.*)")
for dirpath, dirnames, files in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root)
    dirnames[:] = [d for d in dirnames
                   if d not in skip_dirs and not (rel_dir == "." and d.startswith("build"))]
    for f in files:
        if not f.endswith(suffixes) and f not in ("CMakeLists.txt", "Dockerfile", "run"):
            continue
        path = os.path.join(dirpath, f)
        where = os.path.relpath(path, root)
        if where == os.path.join("tests", "deploy", "docs_test.py"):
            continue
        try:
            text = open(path, encoding="utf-8").read()
        except UnicodeDecodeError:
            continue
        if f.endswith((".cc", ".h")):
            for line_no, line in enumerate(text.splitlines(), 1):
                c = comment.search(line)
                if c is None:
                    continue
                for name in source_name.findall(c.group(1)):
                    tree_refs += 1
                    if name not in tree_names and not name.endswith(".pb.h"):
                        failures.append(f"{where}:{line_no}: a comment names {name}, "
                                        "which is not a file of the tree")
        # tests/contract/contract.sh is the workplace's check, copied verbatim
        # (not edited apart: refreshed from ../shared): its words are its own.
        if "DESIGN.md" in text and where != os.path.join("tests", "contract", "contract.sh"):
            failures.append(f"{where}: names DESIGN.md, a file outside the repository: point at docs/")
        # A tracker's numbers mean nothing to a reader of the repository.
        for m in re.finditer(r"\b[Ii]ssue \d+", text):
            failures.append(f"{where}: points at \"{m.group(0)}\", which a reader of the "
                            "repository cannot open: say what the code does instead")
        for m in doc_ref.finditer(text):
            tree_refs += 1
            target = os.path.join(root, "docs", m.group(1))
            if not os.path.exists(target):
                failures.append(f"{where}: names docs/{m.group(1)}, which does not exist")
                continue
            names = headings(target)
            if m.group(2) and m.group(2)[1:] not in {slug(h) for h in names}:
                failures.append(f"{where}: docs/{m.group(1)}{m.group(2)}: no such heading")
            if m.group(3) and m.group(3) not in names:
                failures.append(f'{where}: docs/{m.group(1)}, "{m.group(3)}": no such heading')
        for m in readme_ref.finditer(text):
            tree_refs += 1
            if m.group(1) not in readme_sections:
                failures.append(f'{where}: names README section "{m.group(1)}", which does not exist')

# Every series the server registers is documented.
metrics_doc = open(os.path.join(root, "docs", "metrics.md"), encoding="utf-8").read()
series = set()
for dirpath, _, files in os.walk(os.path.join(root, "server", "metrics")):
    for f in files:
        series |= set(re.findall(r'"(trainwatch_[a-z_]+)"',
                                 open(os.path.join(dirpath, f), encoding="utf-8").read()))
if len(series) < 30:
    failures.append(f"found only {len(series)} series in server/metrics/: the scan is broken")
for name in sorted(series):
    if f"`{name}`" not in metrics_doc:
        failures.append(f"docs/metrics.md does not list {name}, which /metrics exports")

if checked == 0:
    failures.append("no relative links found at all: the README should link docs/")
for f in failures:
    print("FAIL:", f)
print(f"docs_test: {len(docs)} files, {checked} links checked, {doc_paths} paths named in them, "
      f"{tree_refs} references "
      f"from the tree, {len(series)} series, {len(failures)} failures")
sys.exit(1 if failures else 0)
