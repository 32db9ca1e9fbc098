#!/usr/bin/python3
"""The docs name only commands, flags, files and links that exist.

Scans README.md and docs/**/*.md: their code (fenced blocks of shell or of no language, and inline
code spans) and their links.

- attend CLI invocations (`attend <command> [<subcommand>] ...`, `build/client/attend ...`): the
  command exists (`attend <command> --help` exits 0), the subcommand is one the command lists
  (`attend <command> <subcommand> --help` exits 0), an `attend example <name>` is an example the
  CLI knows, and every `--flag` of the invocation is in that command's (or subcommand's) --help
  (hyphens read as underscores, as the CLI reads them).
- attend-server: every `--flag` in a shell segment that runs attend-server (or after the image
  name of a `podman run ... attend:<tag>` / `docker run`), and every flag of a table whose first
  column is headed `flag`, is in `attend-server --help` (or is one of Abseil's built-in flags).
- Scripts run with bash or python3 and repository paths named in code (scripts/..., deploy/...,
  tests/..., ...) exist.
- Every relative markdown link points to a file or folder that exists, and a link's #anchor into
  a markdown file names one of its headings (GitHub's slugs).

Every failure is printed as file:line: message; the exit code is 1 when there is one.

  docs_test.py --cli build/client/attend --server build/server/attend-server --repo .
"""
import argparse
import glob
import os
import re
import subprocess
import sys

SHELL_LANGS = {"", "sh", "bash", "shell", "console", "text"}
# Flags every Abseil binary takes without listing them in --help.
ABSEIL_BUILTIN = {"help", "helpfull", "helpshort", "helppackage", "helpon", "helpmatch",
                  "version", "only_check_args", "flagfile", "fromenv", "tryfromenv", "undefok"}
# Top-level folders whose paths, named in code, must exist (build outputs are not checked).
REPO_DIRS = ("bench/", "client/", "cmake/", "common/", "core/", "deploy/", "docs/", "examples/",
             "planner/", "proto/", "scripts/", "server/", "tests/")
COMMAND_WORD = re.compile(r"^[a-z][a-z0-9-]*$")


class Failures:
    def __init__(self, repo):
        self.repo = repo
        self.items = []

    def add(self, path, line, message):
        self.items.append("%s:%d: %s" % (os.path.relpath(path, self.repo), line, message))


# --- the binaries' help --------------------------------------------------------------------------

def run_help(argv):
    """(exit code, stdout + stderr) of argv, without the caller's ATTEND_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATTEND_")}
    env["COLUMNS"] = "200"
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, env=env, timeout=60)
    return p.returncode, p.stdout.decode("utf-8", "replace")


def section(text, title):
    """The indented lines under a line `title` (up to the next unindented line)."""
    lines, inside = [], False
    for line in text.split("\n"):
        if line.strip() == title:
            inside = True
        elif inside:
            if line and not line.startswith(" "):
                break
            if line.strip():
                lines.append(line)
    return lines


def help_flags(text):
    """{flag name (underscores): takes a value} of every `  --flag` line of a --help text."""
    flags = {}
    for m in re.finditer(r"^\s+--([A-Za-z0-9_-]+)(=<value>)?", text, re.M):
        flags[m.group(1).replace("-", "_")] = bool(m.group(2))
    return flags


class Cli:
    """The attend CLI's commands, subcommands, flags and example names, from its own help."""

    def __init__(self, path):
        self.path = path
        self.cache = {}
        rc, top = run_help([path, "help"])
        if rc != 0:
            raise SystemExit("%s help exited %d:\n%s" % (path, rc, top))
        self.commands = [l.split()[0] for l in section(top, "commands:")]
        if not self.commands:
            raise SystemExit("no commands: in %s help:\n%s" % (path, top))
        self.global_flags = help_flags("\n".join(section(top, "global flags:")))
        if "target" not in self.global_flags:
            raise SystemExit("no global flags: in %s help:\n%s" % (path, top))
        self.top_flags = help_flags(top)
        self._examples = None

    def help(self, words):
        """(exit code, text) of `attend <words> --help`."""
        key = tuple(words)
        if key not in self.cache:
            self.cache[key] = run_help([self.path] + list(words) + ["--help"])
        return self.cache[key]

    def subcommands(self, command):
        rc, text = self.help([command])
        for title in [l.strip() for l in text.split("\n") if l.startswith("subcommands")]:
            return [l.split()[0] for l in section(text, title)]
        return []

    def flags(self, words):
        return help_flags(self.help(words)[1])

    def examples(self):
        """The names `attend example` takes, from the completion script (which lists them)."""
        if self._examples is None:
            rc, text = run_help([self.path, "completion", "bash"])
            m = re.search(r'^\s*example\) words="([^"]*)"', text, re.M)
            self._examples = [w for w in m.group(1).split() if not w.startswith("-")] if m else []
        return self._examples

    def completion_shells(self):
        rc, text = self.help(["completion"])
        m = re.search(r"usage: attend completion (\S+)", text)
        return m.group(1).split("|") if m else []


def server_flags(path):
    rc, text = run_help([path, "--help"])  # Abseil's --help exits 1
    flags = set(re.findall(r"^\s+--([A-Za-z0-9_]+) \(", text, re.M))
    if "address" not in flags:
        raise SystemExit("%s --help lists no --address:\n%s" % (path, text))
    return flags | ABSEIL_BUILTIN


# --- reading the markdown ------------------------------------------------------------------------

def read_doc(path):
    """(code, prose) of a markdown file: code is [(line, text, fenced)] of shell-like code (fenced
    lines with backslash continuations joined, and inline spans); prose is [(line, text)] with
    code removed, for links. Tables are kept as prose lines too."""
    lines = open(path, encoding="utf-8").read().split("\n")
    code, prose = [], []
    fence, lang, pending, pending_line = None, "", "", 0
    paragraph = []  # [(line number, text)] of the current paragraph outside fences

    def flush():
        if not paragraph:
            return
        text = "\n".join(t for _, t in paragraph)
        starts = []
        pos = 0
        for n, t in paragraph:
            starts.append((pos, n))
            pos += len(t) + 1

        def line_at(offset):
            n = paragraph[0][0]
            for start, num in starts:
                if start <= offset:
                    n = num
            return n

        def blank(m):
            code.append((line_at(m.start()), m.group(2).replace("\n", " ").strip(), False))
            return re.sub(r"[^\n]", " ", m.group(0))

        stripped = re.sub(r"(`+)(.+?)\1", blank, text, flags=re.S)
        for n, t in zip((n for n, _ in paragraph), stripped.split("\n")):
            prose.append((n, t))
        paragraph.clear()

    for number, line in enumerate(lines, 1):
        m = re.match(r"^\s*(```+)\s*([\w+-]*)", line)
        if fence is None and m:
            flush()
            fence, lang = m.group(1), m.group(2).lower()
            continue
        if fence is not None:
            if line.strip().startswith(fence) and line.strip().strip("`") == "":
                fence = None
                continue
            if lang not in SHELL_LANGS:
                continue
            if pending:
                pending += " " + line.strip()
            else:
                pending, pending_line = line, number
            if pending.endswith("\\"):
                pending = pending[:-1]
                continue
            code.append((pending_line, pending, True))
            pending = ""
            continue
        if line.strip():
            paragraph.append((number, line))
        else:
            flush()
    flush()
    return code, prose


def slug(heading):
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, fence = set(), False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if re.match(r"^\s*```", line):
            fence = not fence
        elif not fence:
            m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                base = slug(m.group(1))
                name, i = base, 0
                while name in found:
                    i += 1
                    name = "%s-%d" % (base, i)
                found.add(name)
    return found


# --- checks --------------------------------------------------------------------------------------

def tokens_of(segment):
    """[(raw token, stripped token)]: brackets, quotes and process substitutions stripped."""
    out = []
    for raw in segment.split():
        tok = re.sub(r"^[\[(<$\"']+", "", raw)
        tok = re.sub(r"[\])>\"',;]+$", "", tok)
        out.append((raw, tok))
    return out


def is_placeholder(raw):
    return (raw.startswith("<") and not raw.startswith("<(")) or raw.startswith("[") \
        or raw in ("...", "..")


def is_cli(tok):
    return tok == "attend" or tok.endswith("/attend")


def is_server(tok):
    return tok == "attend-server" or tok.endswith("/attend-server")


def segments(text, fenced):
    if fenced:
        text = re.sub(r"(^|\s)#.*$", "", text)  # a shell comment
        text = re.sub(r"^\s*\$\s+", "", text)   # a prompt
    return [s for s in re.split(r"\s(?:\|\||\||&&)\s|;(?:\s|$)|\s&(?:\s|$)", text) if s.strip()]


def check_cli(cli, toks, start, where, fail):
    """Checks the invocation at toks[start]; returns the index where it ends."""
    i = start + 1
    flags = []  # (name, the words whose --help must list it; None: the global flags)

    def take_flags(scope, stop_at_positional):
        nonlocal i
        while i < len(toks):
            raw, tok = toks[i]
            if is_cli(tok) or is_server(tok):
                return
            if tok == "--":
                i = len(toks)
                return
            if tok.startswith("--"):
                name = tok[2:].split("=")[0].replace("-", "_")
                flags.append((name, scope))
                i += 1
                if "=" not in tok and cli.global_flags.get(name) and stop_at_positional:
                    i += 1  # the global flag's value, before the command or subcommand
                continue
            if tok == "-o" and stop_at_positional:
                i += 2
                continue
            if tok.startswith("-"):
                i += 1
                continue
            if stop_at_positional:
                return
            i += 1

    take_flags(None, True)  # global flags before the command
    scope = None
    if i < len(toks) and not is_server(toks[i][1]):
        raw, command = toks[i]  # may be `attend` itself: `attend attend --n_q 4`
        if is_placeholder(raw):
            i += 1  # `attend <command> ...`: only the global flags are known
        elif not COMMAND_WORD.match(command):
            return i  # prose: "the attend CLI's commands"
        else:
            i += 1
            if command not in cli.commands:
                fail(where, "attend %s: no such command (attend help lists %s)"
                     % (command, ", ".join(cli.commands)))
                check_cli_flags(cli, flags, where, fail)
                return i
            rc, _ = cli.help([command])
            if rc != 0:
                fail(where, "attend %s --help exited %d" % (command, rc))
            scope = [command]
            subs = cli.subcommands(command)
            take_flags(scope, True)
            if i < len(toks) and not is_cli(toks[i][1]) and not is_server(toks[i][1]):
                raw, word = toks[i]
                if is_placeholder(raw):
                    i += 1
                elif subs:
                    i += 1
                    if word not in subs:
                        fail(where, "attend %s %s: no such subcommand (attend %s --help lists %s)"
                             % (command, word, command, ", ".join(subs)))
                    else:
                        rc, _ = cli.help([command, word])
                        if rc != 0:
                            fail(where, "attend %s %s --help exited %d" % (command, word, rc))
                        scope = [command, word]
                elif command == "example":
                    i += 1
                    if word not in cli.examples():
                        fail(where, "attend example %s: no such example (the CLI knows %s)"
                             % (word, ", ".join(cli.examples()) or "none: no names in "
                                "'attend completion bash'"))
                elif command == "completion":
                    i += 1
                    if word not in cli.completion_shells():
                        fail(where, "attend completion %s: not a shell it completes (%s)"
                             % (word, "|".join(cli.completion_shells())))
                elif command == "help" and COMMAND_WORD.match(word):
                    i += 1
                    if word not in cli.commands:
                        fail(where, "attend help %s: no such command" % word)
                    elif i < len(toks) and COMMAND_WORD.match(toks[i][1]) \
                            and not is_placeholder(toks[i][0]) and cli.subcommands(word):
                        sub = toks[i][1]
                        i += 1
                        if sub not in cli.subcommands(word):
                            fail(where, "attend help %s %s: no such subcommand" % (word, sub))
    take_flags(scope, False)
    check_cli_flags(cli, flags, where, fail)
    return i


def check_cli_flags(cli, flags, where, fail):
    for name, words in flags:
        if words is None:
            if name not in cli.global_flags:
                fail(where, "attend --%s: not a global flag (attend --help)" % name)
        elif name not in cli.flags(words):
            fail(where, "attend %s --%s: not in 'attend %s --help'"
                 % (" ".join(words), name, " ".join(words)))


def check_code(path, code, cli, server, repo, fail):
    for line, text, fenced in code:
        where = (path, line)
        for segment in segments(text, fenced):
            toks = tokens_of(segment)
            runs_server = any(is_server(t) for _, t in toks)
            i = 0
            cli_flags = set()
            while i < len(toks):
                raw, tok = toks[i]
                if is_cli(tok):
                    end = check_cli(cli, toks, i, where, fail)
                    cli_flags.update(range(i, end))
                    i = max(end, i + 1)
                    continue
                if re.match(r"^attend:[\w.-]+$", tok) and i > 0 and \
                        any(t in ("podman", "docker") for _, t in toks[:i]):
                    for raw2, tok2 in toks[i + 1:]:  # the image's arguments are server flags
                        check_server_flag(tok2, server, where, fail)
                i += 1
            if runs_server:
                for j, (raw, tok) in enumerate(toks):
                    if j not in cli_flags:
                        check_server_flag(tok, server, where, fail)
            for j, (raw, tok) in enumerate(toks):
                prev = toks[j - 1][1] if j else ""
                if prev in ("bash", "sh", "python3") or prev.endswith("/python3"):
                    check_path(tok, repo, where, fail, script=True)
                elif fenced or not text.startswith("--"):
                    check_path(tok, repo, where, fail)


def check_server_flag(tok, server, where, fail):
    if tok.startswith("--") and len(tok) > 2:
        name = tok[2:].split("=")[0]
        if name not in server:
            fail(where, "attend-server --%s: not in 'attend-server --help'" % name)


def check_path(tok, repo, where, fail, script=False):
    if not tok or any(c in tok for c in "<>*${}|") or "/N" in tok or "gen-N" in tok:
        return
    if script:
        if tok.startswith(("/", "..", "-")) or "/" not in tok or tok.startswith("build"):
            return
    elif not tok.startswith(REPO_DIRS):
        return
    tok = tok.split(":")[0].rstrip(".,")
    if not os.path.exists(os.path.join(repo, tok)):
        fail(where, "%s: no such file or folder in the repository" % tok)


def check_flag_tables(path, server, fail):
    """Tables headed `| flag | ...`: the --flags of each row's first cell are the server's."""
    in_table = False
    for number, text in enumerate(open(path, encoding="utf-8").read().split("\n"), 1):
        s = text.strip()
        if not s.startswith("|"):
            in_table = False
            continue
        cells = [c.strip() for c in s.strip("|").split("|")]
        if cells[0] == "flag":
            in_table = True
        elif in_table:
            for name in re.findall(r"`--([A-Za-z0-9_]+)", cells[0]):
                if name not in server:
                    fail((path, number), "attend-server --%s (flag table): not in "
                         "'attend-server --help'" % name)


def check_links(path, prose, repo, fail):
    for line, text in prose:
        for m in re.finditer(r"\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text):
            target = m.group(1)
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", target) or target.startswith("//"):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
                if file_part else path
            if not os.path.exists(resolved):
                fail((path, line), "link %s: %s does not exist"
                     % (target, os.path.relpath(resolved, repo)))
                continue
            if anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                fail((path, line), "link %s: %s has no heading #%s (it has %s)"
                     % (target, os.path.relpath(resolved, repo), anchor,
                        ", ".join(sorted(anchors(resolved)))))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cli", required=True)
    parser.add_argument("--server", required=True)
    parser.add_argument("--repo", required=True)
    args = parser.parse_args()
    repo = os.path.abspath(args.repo)
    cli = Cli(args.cli)
    server = server_flags(args.server)
    failures = Failures(repo)

    def fail(where, message):
        failures.add(where[0], where[1], message)

    docs = [os.path.join(repo, "README.md")] + sorted(
        glob.glob(os.path.join(repo, "docs", "**", "*.md"), recursive=True))
    invocations = 0
    for path in docs:
        code, prose = read_doc(path)
        invocations += sum(1 for _, text, _ in code
                           if re.search(r"(^|[\s/(])attend(-server)?(\s|$)", text))
        check_code(path, code, cli, server, repo, fail)
        check_flag_tables(path, server, fail)
        check_links(path, prose, repo, fail)
    for item in failures.items:
        print(item)
    print("docs_test: %d files, %d code lines naming attend or attend-server, %d failures"
          % (len(docs), invocations, len(failures.items)))
    if invocations < 50:
        print("docs_test: too few invocations found; is the parser reading the docs?")
        return 1
    return 1 if failures.items else 0


if __name__ == "__main__":
    sys.exit(main())
