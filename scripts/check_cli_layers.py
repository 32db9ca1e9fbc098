#!/usr/bin/env python3
"""Checks the layering of the attend CLI's folders (client/cli/, one CMake library each).

Every `#include "client/cli/<folder>/..."` in a file of client/cli/<folder'>/ is an edge
folder' -> folder. The edges must be among those ALLOWED below (which make the graph acyclic:
dependencies point one way, down the list of client/cli/CMakeLists.txt), and the graph they
form must have no cycle. Files directly in client/cli/ (cli.{h,cc}, main.cc) are the top: they
may include every folder, and no folder may include them. Folders not listed are an error, so
that a new one is placed in the layering on purpose.

Usage: check_cli_layers.py [REPO_ROOT]   (default: the repository this script is in)
Exit 0 when the layering holds; 1, naming each offending include as file:line, otherwise.
"""
import os
import re
import sys

TOP = "."  # client/cli/ itself: the attend_cli library and the attend binary

# folder -> the folders its files may include (besides its own).
ALLOWED = {
    "framework": set(),
    "connect": {"framework"},
    "render": {"framework"},
    "tensors": {"framework"},
    "commands": {"framework", "connect", "render", "tensors"},
    "lessons": {"framework", "connect", "render"},
    "bench": {"framework", "connect", "render", "tensors"},
    TOP: {"framework", "connect", "render", "tensors", "commands", "lessons", "bench"},
}

INCLUDE = re.compile(r'^\s*#\s*include\s*"client/cli/([^"]+)"')


def folder_of(rel_path):
    """The layer of a path relative to client/cli/: its first folder, or TOP."""
    parts = rel_path.split("/")
    return parts[0] if len(parts) > 1 else TOP


def find_cycle(edges):
    """A cycle of the graph `edges` (node -> set of nodes) as a list of nodes, or None."""
    state = {}  # node -> 1 while on the stack, 2 when done
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    cli = os.path.join(root, "client", "cli")
    if not os.path.isdir(cli):
        print(f"check_cli_layers: no {cli}", file=sys.stderr)
        return 1
    problems = []
    edges = {}  # folder -> folders it includes, with the first include that makes each edge
    files = 0
    for dirpath, _, names in os.walk(cli):
        for name in sorted(names):
            if not name.endswith((".h", ".cc")):
                continue
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, cli).replace(os.sep, "/")
            src = folder_of(rel)
            files += 1
            if src not in ALLOWED:
                problems.append(f"client/cli/{rel}: folder '{src}' is not in the layering "
                                "(scripts/check_cli_layers.py ALLOWED)")
                continue
            with open(path, encoding="utf-8") as f:
                for line_no, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    if not os.path.exists(os.path.join(cli, target)):
                        problems.append(f"client/cli/{rel}:{line_no}: includes "
                                        f"client/cli/{target}, which does not exist")
                        continue
                    dst = folder_of(target)
                    if dst == src:
                        continue
                    edges.setdefault(src, {}).setdefault(dst, f"client/cli/{rel}:{line_no}")
                    if dst not in ALLOWED.get(src, set()):
                        where = "client/cli/" if dst == TOP else f"client/cli/{dst}/"
                        problems.append(
                            f"client/cli/{rel}:{line_no}: '{src}' may not include {where} "
                            f"(client/cli/{target}); '{src}' may include: "
                            f"{', '.join(sorted(ALLOWED[src])) or 'nothing outside itself'}")
    cycle = find_cycle({src: set(dsts) for src, dsts in edges.items()})
    if cycle:
        steps = [f"{a} -> {b} ({edges[a][b]})" for a, b in zip(cycle, cycle[1:])]
        problems.append("include cycle between folders: " + "; ".join(steps))
    # ALLOWED itself must stay acyclic, so that following it can never build a cycle.
    allowed_cycle = find_cycle(ALLOWED)
    if allowed_cycle:
        problems.append("ALLOWED has a cycle: " + " -> ".join(allowed_cycle))
    if files == 0:
        problems.append(f"no .h or .cc files under {cli}")
    for p in problems:
        print(p)
    if problems:
        return 1
    summary = ", ".join(f"{s} -> {{{', '.join(sorted(d))}}}"
                        for s, d in sorted(edges.items()))
    print(f"check_cli_layers: {files} files, folder edges {summary}: acyclic and as allowed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
