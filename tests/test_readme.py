"""The README and docs/cli.md checked against the code.

- every ``tallmh ...`` command line (in code blocks and in backticks) parses with the command's own parser
  and passes its argument checks that need no data; every ``--option`` named in backticks exists; every
  ``tallmh run DATA ...`` runs on a small table made to its columns (slow);
- the defaults the text states (output folders, chain counts, ESS target, budgets, warmup lengths) are the
  code's;
- every Python code block compiles, and every ``tm.`` name, class, keyword argument and ``result.``
  attribute it uses (in blocks and in backticks) exists with that signature;
- the output block under "Ten lines" has the line shapes ``Result.summary()`` prints today (numbers aside),
  from the README's own code run at a smaller N (slow: a real run).

Each checker is also run on a deliberately wrong string (a negative control) and must refuse it.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import shlex

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
DOCS = ("README.md", os.path.join("docs", "cli.md"))


def _text(name):
    with open(os.path.join(ROOT, name), encoding="utf-8") as f:
        return f.read()


def _blocks(text):
    """``[(language, body, heading)]`` of the fenced code blocks of a markdown text."""
    out, heading, lang, body = [], "", None, []
    for line in text.splitlines():
        if lang is None:
            if line.startswith("#"):
                heading = line.lstrip("#").strip()
            elif line.startswith("```"):
                lang, body = line[3:].strip(), []
        elif line.startswith("```"):
            out.append((lang, "\n".join(body), heading))
            lang = None
        else:
            body.append(line)
    return out


def _prose(text):
    """The text outside fenced code blocks."""
    return re.sub(r"```.*?```", "", text, flags=re.S)


def _spans(text):
    return re.findall(r"`([^`\n]+)`", _prose(text))


# ------------------------------------------------------------------------------------------------------
# command lines


def _is_command(line):
    """``tallmh demo ...``, not a printed line such as ``tallmh run: logistic regression of ...``."""
    return re.match(r"tallmh [a-z-]+( |$)", line) is not None


def _command_lines(text):
    """Every ``tallmh ...`` command of a markdown text, as an argument list (``tallmh`` dropped)."""
    lines = []
    for lang, body, _ in _blocks(text):
        if lang not in ("", "bash", "sh", "console"):
            continue
        joined = body.replace("\\\n", " ")
        for line in joined.splitlines():
            line = line.strip()
            if line.startswith("$ "):
                line = line[2:]
            if _is_command(line):
                lines.append(line)
    lines += [s for s in _spans(text) if _is_command(s)]
    out = []
    for line in lines:
        words = shlex.split(line, comments=True)
        for stop in ("&&", "||", "|", ";", ">"):
            if stop in words:
                words = words[: words.index(stop)]
        out.append(words[1:])
    return out


def check_command(argv, tmp_path):
    """Parses ``argv`` with the real parser and applies the checks the command makes before reading data;
    raises ``CLIError`` (or ``SystemExit`` for --help) when the command line would be refused."""
    from tallmh.cli import build_parser
    from tallmh.method_options import check_test_args
    from tallmh.run_table import _formula_args

    args = build_parser().parse_args(argv)
    if args.command == "run" and not args.resume:
        assert args.data is not None, f"no DATA in {argv}"
        if args.formula:
            _formula_args(args)
        else:
            assert args.target is not None, f"no --target in {argv}"
        if args.samples is None:
            args.samples = "auto"
        if args.model != "linear" and args.noise_sd is not None:
            raise AssertionError(f"--noise-sd without --model linear in {argv}")
        check_test_args(args.test, args)
    if args.command == "demo":
        from tallmh.method_options import DEMO_METHODS

        if args.methods != "all":
            unknown = [m for m in args.methods.split(",") if m not in DEMO_METHODS]
            assert not unknown, f"unknown demo methods {unknown} in {argv}"
    return args


def test_every_command_line_parses(tmp_path):
    seen = 0
    for name in DOCS:
        for argv in _command_lines(_text(name)):
            if argv == ["run"]:  # the command named in prose ("`tallmh run` writes ...")
                continue
            if argv and argv[0] in ("demo", "run"):
                check_command(argv, tmp_path)
                seen += 1
            else:  # 'tallmh' alone or with a command this parser lacks
                raise AssertionError(f"{name}: 'tallmh {' '.join(argv)}' is not a command of tallmh")
    assert seen >= 8, seen  # the checker found the README's and the transcript's commands


def test_wrong_command_lines_are_refused(tmp_path):
    """The negative control: the same checker refuses a misspelt option, a value out of range, an unknown
    test, a missing target and an unknown demo method."""
    from tallmh.errors import CLIError

    text = "```bash\ntallmh run flights.csv --target late --chainz 2\n```\n"
    (bad,) = _command_lines(text)
    for argv in (bad, ["run", "a.csv", "--target", "y", "--samples", "2"],
                 ["run", "a.csv", "--target", "y", "--test", "exactt"], ["run", "a.csv"],
                 ["demo", "--methods", "recommended,fastest"], ["run", "a.csv", "--target", "y", "--error", "0.05",
                                                                "--epsilon", "0.01"]):
        with pytest.raises((CLIError, AssertionError, ValueError)):
            check_command(argv, tmp_path)


def _option_strings():
    from tallmh.cli import build_parser

    parser = build_parser()
    subs = parser._subparsers._group_actions[0].choices  # noqa: SLF001 - the parser's own sub-commands
    return {name: {o for a in p._actions for o in a.option_strings} for name, p in subs.items()}


_PLACEHOLDER = re.compile(r"^([A-Z]+|N|DIR|\.\.\.|…)$")


def check_option_span(span, options):
    """A backticked ``--option [value]``: the option exists in ``tallmh run`` or ``tallmh demo``, and a value
    that is not a placeholder (``DIR``, ``F``) parses."""
    words = span.split()
    flag = words[0].split("=")[0]
    owners = [c for c, opts in options.items() if flag in opts]
    assert owners, f"`{span}`: no command has {flag}"
    if len(words) == 1 or any(_PLACEHOLDER.match(w) for w in words[1:]) or words[1].endswith(":"):
        return
    errors = []
    for command in owners:
        argv = [command] + (["x.csv", "--target", "y"] if command == "run" else []) + words
        try:
            check_command(argv, None)
            return
        except Exception as e:  # noqa: BLE001 - try the other command
            errors.append(e)
    raise AssertionError(f"`{span}`: {errors}")


# the mistakes docs/cli.md lists as refused: each must be refused
REFUSED_EXAMPLES = {"--samples 2"}


def test_every_option_named_in_backticks_exists():
    options = _option_strings()
    seen = 0
    for name in DOCS:
        for span in _spans(_text(name)):
            if span in REFUSED_EXAMPLES:
                with pytest.raises(Exception):
                    check_option_span(span, options)
            elif re.match(r"--[a-z]", span):
                check_option_span(span, options)
                seen += 1
    assert seen >= 10, seen


def test_a_wrong_option_in_backticks_is_caught():
    options = _option_strings()
    for span in ("--samplez 5000", "--test exactt", "--samples 2", "--chains zero"):
        with pytest.raises((AssertionError, Exception)):
            check_option_span(span, options)
    check_option_span("--samples 5000", options)  # and the right one passes


# ------------------------------------------------------------------------------------------------------
# defaults the text states


def _one(pattern, text, what):
    found = re.findall(pattern, text)
    assert found, f"the text no longer states {what} (pattern {pattern!r}): update this test with it"
    return found


def test_stated_defaults_are_the_codes():
    from tallmh.cli import build_parser
    from tallmh.run import configure
    import tallmh as tm

    readme, cli = _text("README.md"), _text(os.path.join("docs", "cli.md"))
    parser = build_parser()
    run = parser.parse_args(["run", "x.csv"])
    demo = parser.parse_args(["demo"])
    sample = inspect.signature(tm.sample).parameters

    # output folders: the README names both, and no other
    assert f"`{run.out}/`" in readme and f"`{demo.out}/`" in readme
    for folder in re.findall(r"`\./(tallmh-[a-z]+)/`", readme + cli):
        assert f"./{folder}" in (run.out, demo.out), folder
    # chains: the command line's and the API's
    for n in _one(r"but (\d+) chains", readme, "the command line's chain count"):
        assert int(n) == run.chains
    for n in re.findall(r"starts (\d+) chains", readme):
        assert int(n) == sample["num_chains"].default
    # the ESS target and the time limit of num_samples="auto"
    for n in _one(r"`--min-ess` \((\d+)\)", cli, "--min-ess's default"):
        assert float(n) == run.min_ess == sample["min_ess"].default
    for n in re.findall(r"smallest bulk ESS is (\d+)", readme):
        assert float(n) == sample["min_ess"].default
    for n in _one(r"within (\d+) s(?: of sampling)?[;)]", readme + cli, "the time limit of --samples auto"):
        assert float(n) == configure.AUTO_BUDGET_S
    # warmup lengths
    for n in re.findall(r"tuned in (\d+)\s+warmup steps", readme) + re.findall(r"\((\d+) warmup steps\)", cli):
        assert int(n) == configure.AUTO_WARMUP_LAPLACE
    for n in re.findall(r"([\d,]+) where there is no Laplace start", readme):
        assert int(n.replace(",", "")) == configure.AUTO_WARMUP
    # the demo: budget, reference
    for n in _one(r"`--budget` seconds \((\d+)\)", cli, "the demo's budget"):
        assert float(n) == demo.budget
    for n in re.findall(r"control variates, (\d+) s each", readme):
        assert float(n) == demo.budget
    for c, d in _one(r"(\d+) [×x] ([\d,]+) draws\)", cli, "the demo's reference size"):
        assert (int(c), int(d.replace(",", ""))) == (demo.reference_chains, demo.reference_draws)
    # the demo's "accurate": the README's rule is the comparison's
    from tallmh.reporting import compare

    for mean_sd, pct in _one(r"max error ≤ ([\d.]+) sd \+ 3 MCSE and sd ratios within\s+(\d+)%", readme,
                             "the rule for 'accurate'"):
        assert float(mean_sd) == compare.ACCURATE_MEAN_SD
        assert compare.ACCURATE_SD_RATIO == pytest.approx((1 - int(pct) / 100, 1 + int(pct) / 100))
    # --noise-prior-scale and the checkpoint interval
    for n in _one(r"`--noise-prior-scale`,\s+(\d+)\)", cli, "--noise-prior-scale's default"):
        assert float(n) == run.noise_prior_scale


# ------------------------------------------------------------------------------------------------------
# Python: blocks and backticked expressions


def _namespaces():
    import tallmh as tm

    return [tm, tm.acceptance, tm.proposals, tm.models]


def _resolve(node, env):
    """The object an expression ``tm.a.b`` / ``Name`` stands for, or ``None`` when its root is not tallmh's."""
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, env)
        if base is None:
            return None
        assert hasattr(base, node.attr), f"{ast.unparse(node)}: {getattr(base, '__name__', base)} has no {node.attr!r}"
        return getattr(base, node.attr)
    if isinstance(node, ast.Name):
        if node.id in env:
            return env[node.id]
        if node.id[:1].isupper():  # a class named bare in the text: one of tallmh's
            for ns in _namespaces():
                if hasattr(ns, node.id):
                    return getattr(ns, node.id)
            raise AssertionError(f"{node.id}: not a name of tallmh, tallmh.acceptance, tallmh.proposals or tallmh.models")
    return None


def check_python(source):
    """Compiles ``source`` and checks every tallmh name, call keyword and ``result.`` attribute in it."""
    import tallmh as tm

    tree = ast.parse(source)
    compile(tree, "<docs>", "exec")
    env = {"tm": tm, "tallmh": tm}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("result", "r"):
            fields = getattr(tm.Result, "__dataclass_fields__", {})
            assert hasattr(tm.Result, node.attr) or node.attr in fields, f"Result has no {node.attr!r}"
        if isinstance(node, ast.Attribute):
            _resolve(node, env)
        if isinstance(node, ast.Call):
            fn = _resolve(node.func, env)
            if fn is None or not callable(fn):
                continue
            try:
                sig = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            params = sig.parameters
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            for kw in node.keywords:
                if kw.arg is not None:
                    assert kw.arg in params, f"{ast.unparse(node.func)}() has no argument {kw.arg!r}"
            positional = [p for p in params.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
            if not any(p.kind is p.VAR_POSITIONAL for p in params.values()):
                assert len(node.args) <= len(positional), f"{ast.unparse(node)}: too many positional arguments"


def _python_spans(text):
    """Backticked spans that are Python expressions using tallmh (``tm.x(...)``, ``Austerity(error=0.05)``,
    ``test=tm.acceptance.Exact()``)."""
    out = []
    for span in _spans(text):
        expr = re.sub(r"^[a-z_]+=", "", span)  # a keyword argument as written in prose
        if not re.match(r"^(tm\.|result\.|[A-Z][A-Za-z]+\(|[a-z]+\.[A-Z][A-Za-z]+\()", expr):
            continue
        if re.match(r"^[a-z]+\.", expr) and not expr.startswith(("tm.", "result.", "proposals.", "acceptance.",
                                                                   "models.")):
            continue
        if expr.startswith(("proposals.", "acceptance.", "models.")):
            expr = "tm." + expr
        try:
            ast.parse(expr, mode="eval")
        except SyntaxError:
            continue
        out.append(expr)
    return out


def test_python_blocks_and_names_exist():
    readme = _text("README.md")
    blocks = [body for lang, body, _ in _blocks(readme) if lang == "python"]
    assert len(blocks) >= 2
    for body in blocks:
        check_python(body)
    spans = _python_spans(readme) + _python_spans(_text(os.path.join("docs", "cli.md")))
    assert len(spans) >= 10, spans
    for expr in spans:
        check_python(expr)


@pytest.mark.parametrize("wrong", [
    "tm.sample(model, data, num_sample=5)",          # a keyword the function lacks
    "tm.acceptance.Exactt()",                       # a class that is not there
    "Austerity(eror=0.05)",                         # a keyword of a bare class
    "Austerityy(error=0.05)",                       # a bare class that is not there
    "result.verdikt",                               # a Result attribute that is not there
    "tm.sample(model, data\n",                      # does not compile
])
def test_wrong_python_is_caught(wrong):
    with pytest.raises((AssertionError, SyntaxError)):
        check_python(wrong)


# ------------------------------------------------------------------------------------------------------
# the "Ten lines" output block


_NUMBER = re.compile(r"(?<![\w.])-?\d[\d_,]*(\.\d+)?(e[+-]?\d+)?|\d[\d_,]*(\.\d+)?(e[+-]?\d+)?")


def shape(line):
    """A printed line with its numbers replaced by ``#`` and its spaces collapsed."""
    return " ".join(_NUMBER.sub("#", line).split())


def check_output_shapes(documented, printed):
    """Each documented line has the shape of the printed line in the same place; ``...`` ends the check."""
    printed = [p for p in printed if p.strip()]
    for i, line in enumerate(documented):
        if line.strip() in ("...", "…"):
            return
        assert i < len(printed), f"the documented line {line!r} has no printed counterpart"
        assert shape(line) == shape(printed[i]), f"documented:\n  {line}\nprinted today:\n  {printed[i]}"
    assert len(documented) == len(printed), "the documented block stops before the printed one, without '...'"


def _ten_lines():
    blocks = [(lang, body) for lang, body, heading in _blocks(_text("README.md")) if heading == "Ten lines"]
    code = [b for lang, b in blocks if lang == "python"]
    output = [b for lang, b in blocks if lang == ""]
    assert code and output, "the README's 'Ten lines' section has no code or no output block"
    return code[0], output[0].splitlines()


def test_output_shape_checker_catches_a_changed_line():
    printed = ["method x: 4 chains x 953 draws, N = 1000000", "trusted", "a 1.0 b"]
    check_output_shapes(["method x: 4 chains x 10 draws, N = 20", "trusted", "..."], printed)
    with pytest.raises(AssertionError):
        check_output_shapes(["method x: 4 chains x 10 draws, N = 20", "whole process: 7.2 s", "..."], printed)
    with pytest.raises(AssertionError):
        check_output_shapes(["method x: 4 chains of 10 draws, N = 20", "trusted", "..."], printed)


@pytest.mark.slow
def test_ten_lines_output_has_the_shapes_summary_prints(tmp_path, monkeypatch, capsys):
    """Runs the README's ten lines at N = 20,000 (not 10^6) and compares the printed summary's lines with
    the README's output block, numbers aside."""
    code, documented = _ten_lines()
    small, n = re.subn(r"simulate\(\s*[\d_]+", "simulate(20_000", code)
    assert n == 1, "the ten lines no longer simulate their data with simulate(N, ...)"
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    exec(compile(small, "README ten lines", "exec"), {"__name__": "readme"})  # noqa: S102 - our own README
    printed = capsys.readouterr().out.splitlines()
    check_output_shapes(documented, printed)


# ------------------------------------------------------------------------------------------------------
# the command lines run, on small tables made to their columns


def _table_for(argv, folder):
    """A small table with the columns ``argv`` names (``--target``, ``--formula``), written where its DATA
    path says (inside ``folder``); returns ``argv`` with that path and short-run options."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(0)
    n = 3000
    args = check_command(argv, None)
    cols, family = {}, args.family or ("bernoulli" if args.model == "logistic" else "gaussian")
    if args.formula:
        lhs, rhs = args.formula.split("~")
        response = lhs.strip()
        for cat in re.findall(r"C\((\w+)\)", rhs):
            cols[cat] = rng.choice(["a", "b", "c"], n)
        for name in re.findall(r"\b([A-Za-z_]\w*)\b", re.sub(r"C\(\w+\)", "", rhs)):
            cols.setdefault(name, rng.normal(size=n))
    else:
        response = args.target
        for j in range(3):
            cols[f"x{j}"] = rng.normal(size=n)
    eta = 0.3 * sum(v for v in cols.values() if v.dtype.kind == "f")
    cols[response] = {"bernoulli": lambda: (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(int),
                      "poisson": lambda: rng.poisson(np.exp(0.5 + 0.3 * eta)),
                      "negativebinomial": lambda: rng.poisson(np.exp(0.5 + 0.3 * eta)),
                      "gaussian": lambda: eta + rng.normal(size=n)}[family]()
    path = os.path.join(folder, os.path.basename(args.data))
    pd.DataFrame(cols).to_csv(path, index=False)
    out = [path if a == args.data else a for a in argv]
    return out + ["--samples", "40", "--warmup", "20", "--chains", "1", "--quiet",
                  "--out", os.path.join(folder, "out-" + os.path.basename(args.data))]


@pytest.mark.slow
def test_every_run_command_runs(tmp_path, monkeypatch, capsys):
    """Each ``tallmh run DATA ...`` of the README and docs/cli.md, on a small table with its columns, ends
    with status 0 and writes its results (short: 40 draws, one chain)."""
    from tallmh.cli import main

    monkeypatch.setenv("TALLMH_CACHE", str(tmp_path / "cache"))
    ran = 0
    for name in DOCS:
        for argv in _command_lines(_text(name)):
            if argv[:1] != ["run"] or len(argv) < 2 or argv[1].startswith("-"):
                continue  # ('tallmh run --resume DIR' and the like: no table of their own)
            if _PLACEHOLDER.match(argv[1]):  # 'tallmh run DATA --target y': a CSV in its place
                argv = [argv[0], "data.csv"] + argv[2:]
            full = _table_for(argv, str(tmp_path))
            assert main(full) == 0, (argv, capsys.readouterr().err[-1500:])
            out = full[len(full) - full[::-1].index("--out")]  # (the last --out given: ours)
            assert os.path.exists(os.path.join(out, "results.json")), out
            ran += 1
    assert ran >= 3, ran
