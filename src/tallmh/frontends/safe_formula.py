"""A formula read from a run folder (``run.json``), checked against a small grammar before anything evaluates it.

A formula's terms are Python expressions that formulaic evaluates (``I(...)``, ``np.log(x)``, ...), so a
formula is code. One typed on the command line is the user's own; one read from a run folder with
``tallmh run --resume`` is data, which may come from anyone. :func:`check_formula` accepts only column
names, numbers, the formula operators (``~ + - * / : ** ^ ( ) ,``), keyword arguments and calls of a short
list of transforms (:data:`TRANSFORMS`); anything else (attribute access outside the list, other calls,
strings other than plain level names, brackets, braces, Python keywords, names with double underscores, ...) is refused
with a one-line :class:`~tallmh.errors.CLIError`. Nothing is evaluated and formulaic is not imported.
"""

from __future__ import annotations

import keyword
import re

from ..errors import CLIError

__all__ = ["TRANSFORMS", "check_formula"]

# the calls a formula from a run folder may make: formulaic's own transforms and numpy's elementwise ones
TRANSFORMS = frozenset({
    "C", "I", "center", "scale", "poly", "bs", "cr", "cs", "cc", "te", "lag", "contr.treatment",
    "contr.sum", "contr.helmert", "contr.poly", "contr.diff", "log", "exp", "sqrt",
    "np.log", "np.log1p", "np.log2", "np.log10", "np.exp", "np.expm1", "np.sqrt", "np.abs", "np.square",
    "np.sin", "np.cos", "np.tanh", "np.arcsinh",
})

_TOKEN = re.compile(r"""
    (?P<space>\s+)
  | (?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)
  | (?P<quoted>`[A-Za-z0-9_ .\-]*`)
  | (?P<string>'[A-Za-z0-9_ .\-]*'|"[A-Za-z0-9_ .\-]*")
  | (?P<op>\*\*|[~+\-*/:^(),=])
""", re.VERBOSE)

_MAX_LEN = 2000


def _refuse(formula: str, why: str):
    shown = formula if len(formula) <= 120 else formula[:117] + "..."
    raise CLIError(f"--resume: refused: the formula in run.json, {shown!r}, {why}; a run folder's formula is "
                   "never evaluated unless it uses only column names, numbers, the operators ~ + - * / : ** ^ and "
                   f"the transforms {', '.join(sorted(TRANSFORMS))} (if you wrote this run yourself, give the "
                   "formula again with --formula beside --resume)")


def check_formula(formula) -> str:
    """``formula`` if it fits the grammar of the module docstring, else a one-line CLIError (nothing run)."""
    if not isinstance(formula, str):
        raise CLIError(f"--resume: refused: the formula in run.json is not text ({type(formula).__name__})")
    if len(formula) > _MAX_LEN:
        _refuse(formula, f"is longer than {_MAX_LEN} characters")
    if formula.count("~") != 1:
        _refuse(formula, "needs exactly one '~'")
    tokens = []
    pos = 0
    while pos < len(formula):
        m = _TOKEN.match(formula, pos)
        if m is None:
            _refuse(formula, f"holds {formula[pos]!r} at character {pos + 1}")
        pos = m.end()
        if m.lastgroup != "space":
            tokens.append((m.lastgroup, m.group()))
    depth = 0
    calls = []  # for each open parenthesis: whether it opens a call's arguments
    prev = None
    for i, (kind, text) in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else (None, None)
        if kind == "name":
            if "__" in text or any(keyword.iskeyword(part) for part in text.split(".")):
                _refuse(formula, f"names {text!r}")
            if nxt == ("op", "("):
                if text not in TRANSFORMS:
                    _refuse(formula, f"calls {text!r}, which is not one of the transforms allowed")
            elif "." in text:
                _refuse(formula, f"reads the attribute {text!r}")
            elif nxt == ("op", "=") and not (calls and calls[-1]):
                _refuse(formula, f"assigns {text!r} outside a transform's arguments")
        elif kind == "string" and not (calls and calls[-1]):
            _refuse(formula, f"holds the text {text} outside a transform's arguments")
        elif kind == "op":
            if text == "(":
                is_call = prev is not None and prev[0] == "name"
                if prev is not None and (prev[0] in ("number", "string", "quoted") or prev == ("op", ")")):
                    _refuse(formula, "calls something that is not a transform")
                calls.append(is_call)
                depth += 1
            elif text == ")":
                depth -= 1
                if depth < 0:
                    _refuse(formula, "has an unmatched ')'")
                calls.pop()
            elif text == "=":
                if prev is None or prev[0] != "name" or not (calls and calls[-1]) or nxt == ("op", "="):
                    _refuse(formula, "holds an '=' that is not a transform's keyword argument")
        prev = (kind, text)
    if depth != 0:
        _refuse(formula, "has an unmatched '('")
    return formula
