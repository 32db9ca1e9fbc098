#!/usr/bin/env python3
"""Each source folder is one library (docs/development.md, "Layout"): every folder of the
product (not tests, benchmarks, fuzz targets or deployment) that holds .cc files has its own
CMakeLists.txt, which declares exactly one library, plus at most the executables the folder
is for (attend-server, attend). Prints each folder that breaks the rule; exit 1 if any.

Usage: scripts/check_layout.py [repository root]
"""
import os
import re
import sys

# Folders that are not product libraries.
SKIP = {"build", ".git", "tests", "bench", "fuzz", "deploy", "node_modules", "third_party",
        "scripts", "cmake", "docs", "proto"}


def declared(cmake_text):
    """(libraries, executables) that a CMakeLists.txt declares; ALIAS targets are not counted."""
    libs, exes = [], []
    for kind, name, rest in re.findall(r"add_(library|executable)\(\s*([\w.:-]+)([^)]*)\)",
                                       cmake_text):
        if rest.split() and rest.split()[0] in ("ALIAS", "IMPORTED"):
            continue
        (libs if kind == "library" else exes).append(name)
    return libs, exes


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else
                           os.path.join(os.path.dirname(__file__), ".."))
    problems = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        if rel == ".":
            dirs[:] = [d for d in dirs if d not in SKIP and not d.startswith("build")]
            continue
        dirs[:] = [d for d in dirs if d not in SKIP]
        if not any(f.endswith(".cc") for f in files):
            continue
        cmake = os.path.join(folder, "CMakeLists.txt")
        if not os.path.exists(cmake):
            problems.append("%s: .cc files but no CMakeLists.txt (a parent declares them)" % rel)
            continue
        with open(cmake) as f:
            libs, exes = declared(f.read())
        if len(libs) != 1:
            problems.append("%s: declares %d libraries (%s); a folder is one library"
                            % (rel, len(libs), ", ".join(libs) or "none"))
    for p in problems:
        print(p)
    print("layout: %s" % ("%d problem(s)" % len(problems) if problems
                          else "every folder is one library"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
