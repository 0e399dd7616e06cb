"""The code's shape: lines of code per module, class and function, and import circles.

Lines of code are the lines that hold code: blank lines, comment-only lines and docstrings are not counted.
Limits: a module at most 600 lines of code, a class at most 250, a function at most 80; and no import circle
among tallmh's modules, counting imports inside functions (a package's ``__init__`` importing its own
submodules is not an edge back up). Prints the largest of each and every breach; exits 1 on a breach.

    python scripts/code_size.py            # (CI runs it)
"""

from __future__ import annotations

import ast
import io
import os
import sys
import tokenize

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src", "tallmh")
LIMITS = {"module": 600, "class": 250, "function": 80}


def _docstring_lines(tree) -> set:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.update(range(body[0].lineno, body[0].end_lineno + 1))
    return out


def _code_lines(src: str, tree) -> set:
    """The line numbers that hold a token of code (not a comment, not a docstring, not blank)."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                        tokenize.ENDMARKER):
            continue
        lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines - _docstring_lines(tree)


def measure(root=ROOT):
    """``[(kind, name, lines of code)]`` for every module, class and function under ``root``."""
    out = []
    for dirpath, _, files in os.walk(root):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(dirpath, f)
            src = open(path, encoding="utf-8").read()
            tree = ast.parse(src)
            code = _code_lines(src, tree)
            rel = os.path.relpath(path, os.path.dirname(root))
            out.append(("module", rel, len(code)))
            for node in ast.walk(tree):
                if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = len(code & set(range(node.lineno, node.end_lineno + 1)))
                    kind = "class" if isinstance(node, ast.ClassDef) else "function"
                    out.append((kind, f"{rel}:{node.lineno} {node.name}", n))
    return out


def _module_names(root):
    names = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, os.path.dirname(root))[:-3].replace(os.sep, ".")
                names[rel[: -len(".__init__")] if rel.endswith(".__init__") else rel] = path
    return names


def import_graph(root=ROOT, top_level_only=False):
    """``{module: {tallmh modules it imports}}``: anywhere in its code, or (``top_level_only``) at module level."""
    names = _module_names(root)
    graph = {}
    for mod, path in names.items():
        is_pkg = path.endswith("__init__.py")
        deps = set()
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in (tree.body if top_level_only else ast.walk(tree)):
            if isinstance(node, ast.ImportFrom):
                if node.level == 0:
                    if not (node.module or "").startswith("tallmh"):
                        continue
                    target = node.module
                else:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    target = ".".join(base + ([node.module] if node.module else []))
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    deps.add(sub if sub in names else target)
            elif isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("tallmh"))
        deps = {d for d in deps if d in names and d != mod and not mod.startswith(d + ".")}
        graph[mod] = deps
    return graph


def cycles(graph):
    """Every import circle found by a depth-first walk (each as the list of modules, first repeated last)."""
    seen, stack, found = set(), [], []

    def visit(m):
        if m in stack:
            found.append(stack[stack.index(m):] + [m])
            return
        if m in seen:
            return
        seen.add(m)
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            visit(d)
        stack.pop()

    for m in sorted(graph):
        visit(m)
    return found


def main() -> int:
    rows = measure()
    breaches = [(k, name, n) for k, name, n in rows if n > LIMITS[k]]
    for kind in ("module", "class", "function"):
        top = sorted((r for r in rows if r[0] == kind), key=lambda r: -r[2])[:3]
        print(f"largest {'classes' if kind == 'class' else kind + 's'} (limit {LIMITS[kind]} lines of code): "
              + "; ".join(f"{name} {n}" for _, name, n in top))
    circles = cycles(import_graph())
    print(f"import circles (imports inside functions included): {len(circles)}")
    for c in circles:
        print("  circle: " + " -> ".join(c))
    for kind, name, n in breaches:
        print(f"  over the limit: {kind} {name}: {n} lines of code (limit {LIMITS[kind]})")
    print(f"{len(breaches)} over the limits, {len(circles)} import circle(s)")
    return 1 if breaches or circles else 0


if __name__ == "__main__":
    sys.exit(main())
