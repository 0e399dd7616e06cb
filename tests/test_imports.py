"""The package's import structure: no circles among imports (inside functions too), no private names across modules."""

import ast
import importlib.util
import os

import tallmh

SRC = os.path.dirname(tallmh.__file__)


def _modules():
    for root, _, files in os.walk(SRC):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(SRC))[:-3].replace(os.sep, ".")
                yield (rel[: -len(".__init__")] if rel.endswith(".__init__") else rel), path


def _resolve(mod, is_pkg, node):
    """The absolute tallmh module an ImportFrom names (None: not tallmh's)."""
    if node.level == 0:
        return node.module if (node.module or "").startswith("tallmh") else None
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(top_level_only):
    names = dict(_modules())
    out = {}
    for mod, path in names.items():
        tree = ast.parse(open(path).read())
        is_pkg = path.endswith("__init__.py")
        nodes = tree.body if top_level_only else list(ast.walk(tree))
        deps = []
        for node in nodes:
            if isinstance(node, ast.ImportFrom):
                target = _resolve(mod, is_pkg, node)
                if target is None:
                    continue
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    # a submodule imported by name is a module, not a private name of another module
                    deps.append((sub, None) if sub in names else (target, alias.name))
            elif isinstance(node, ast.Import):
                deps += [(a.name, None) for a in node.names if a.name.startswith("tallmh")]
        out[mod] = deps
    return names, out


def _code_size():
    """``scripts/code_size.py`` (the graph and the circle walk CI prints), loaded from the checkout."""
    path = os.path.join(os.path.dirname(__file__), "..", "scripts", "code_size.py")
    spec = importlib.util.spec_from_file_location("code_size", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _cycles(top_level_only, root=SRC):
    cs = _code_size()
    return cs.cycles(cs.import_graph(root, top_level_only))


def test_no_import_circles_at_module_level():
    assert not _cycles(True)


def test_no_import_circles_counting_imports_inside_functions():
    assert not _cycles(False)


def test_no_private_names_imported_across_modules():
    names, deps = _imports(top_level_only=False)
    bad = [(m, d, n) for m, ds in deps.items() for d, n in ds
           if n and n.startswith("_") and not n.startswith("__") and d != m and d in names]
    assert not bad, bad


def test_acceptance_does_not_import_the_kernel_or_the_runner():
    names, deps = _imports(top_level_only=False)
    for m, ds in deps.items():
        if m.startswith("tallmh.acceptance"):
            assert not any(d.startswith(("tallmh.kernel", "tallmh.run", "tallmh.informed")) for d, _ in ds), (m, ds)


def test_negative_control_a_circle_is_found(tmp_path):
    # the same walk on a two-module circle finds it
    a = ast.parse("from .b import f\n")
    node = a.body[0]
    assert _resolve("tallmh.a", False, node) == "tallmh.b"


def test_negative_control_a_circle_inside_functions_is_found(tmp_path):
    """A circle closed by an import inside a function: found when such imports count, not at module level."""
    pkg = tmp_path / "tallmh"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import g\n")
    (pkg / "b.py").write_text("def g():\n    from .a import f\n    return f\n")
    assert _cycles(False, str(pkg)) == [["tallmh.a", "tallmh.b", "tallmh.a"]]
    assert _cycles(True, str(pkg)) == []


def test_the_code_is_within_its_size_limits():
    """No module over 600 lines of code, class over 250, function over 80 (scripts/code_size.py)."""
    cs = _code_size()
    over = [(k, name, n) for k, name, n in cs.measure(SRC) if n > cs.LIMITS[k]]
    assert not over, over
