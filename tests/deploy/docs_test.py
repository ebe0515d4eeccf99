"""The README is the front door: short, and every relative link in it and in
docs/ resolves to a file inside the repository (no path outside it)."""
import os
import re
import sys

root = os.path.abspath(sys.argv[1])
failures = []

readme = os.path.join(root, "README.md")
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

if checked == 0:
    failures.append("no relative links found at all: the README should link docs/")
for f in failures:
    print("FAIL:", f)
print(f"docs_test: {len(docs)} files, {checked} links checked, {len(failures)} failures")
sys.exit(1 if failures else 0)
