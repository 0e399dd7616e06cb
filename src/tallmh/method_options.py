"""The acceptance tests as the ``tallmh`` command names them (``exact``, ``austerity``, ..., a ``-cv`` suffix for
control variates): their options checked before anything heavy is imported, the test objects, the batch
each needs, and the settings recorded with a run."""

from __future__ import annotations

from .errors import CLIError

__all__ = ["METHODS", "DEMO_METHODS", "DEMO_DEFAULT", "BOUNDS", "THINNING", "check_test_args", "default_test_options",
           "make_test", "batch_of", "method_config", "label_of"]

METHODS = ("exact", "austerity", "confidence", "barker", "austerity-cv", "confidence-cv", "barker-cv")
# "-cv": the same test with second-order Taylor control variates at the posterior mode (tallmh.ControlVariates)
# the demo also runs "recommended": what tallmh.sample and 'tallmh run' use by default for its logistic regression
# (a model that bounds its Taylor remainders, data in memory): the exact subsampled test (Poisson thinning) with
# second-order control variates and Crank-Nicolson proposals from the Laplace approximation at the mode
DEMO_METHODS = ("recommended",) + METHODS
DEMO_DEFAULT = ("recommended", "exact", "austerity")  # 'all' runs every method (about 2 minutes more)
BOUNDS = ("hoeffding", "empirical-bernstein", "bernstein-serfling")


def check_test_args(name: str, args):
    """The method options' refusals, made before anything heavy is imported."""
    name = name[:-3] if name.endswith("-cv") else name
    if name in ("austerity", "auto") and args.epsilon is not None and args.error is not None:
        raise CLIError("--error (per-step error target) and --epsilon (per-look level) exclude each other")
    if name == "confidence" and not args.gamma > 1:
        raise CLIError(f"--gamma must be greater than 1; got {args.gamma}")
    if name not in ("auto",) + DEMO_METHODS:
        raise CLIError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def default_test_options(args) -> bool:
    """Whether --test auto runs with tallmh.sample's own choice (no austerity option given)."""
    return args.error is None and args.epsilon is None and args.batch_size == "auto"


def make_test(name: str, args):
    """The test object; None for ``auto`` with default options (tallmh.sample then picks the recommended
    one)."""
    check_test_args(name, args)
    if name == "auto" and default_test_options(args):
        return None
    import tallmh as tm

    name = name[:-3] if name.endswith("-cv") else name
    if name == "exact":
        return tm.acceptance.Exact()
    if name == "recommended":  # exact: the austerity options (--error, --epsilon, --batch-size) do not apply
        return tm.acceptance.PoissonThinning()
    if name in ("austerity", "auto"):
        if args.epsilon is not None:
            return tm.acceptance.Austerity(epsilon=args.epsilon, batch_size=args.batch_size)
        return tm.acceptance.Austerity(error=0.05 if args.error is None else args.error, batch_size=args.batch_size)
    if name == "confidence":
        return tm.acceptance.Confidence(delta=args.delta, bound=args.bound, p=2.0, gamma=args.gamma,
                                        initial_batch=args.initial_batch)
    if name == "barker":
        return tm.acceptance.Barker(batch_size=args.barker_batch, delta=args.barker_delta)
    raise CLIError(f"unknown method {name!r}; choose from {', '.join(METHODS)}")


def batch_of(name: str, args) -> int:
    name = name[:-3] if name.endswith("-cv") else name
    austerity = 2 if args.batch_size == "auto" else args.batch_size  # "auto" fits the rows there are
    return {"exact": 1, "austerity": austerity, "auto": austerity, "recommended": 1,
            "confidence": args.initial_batch,
            "barker": args.barker_batch}[name]


THINNING = "exact-subsampled"  # (tallmh.acceptance.PoissonThinning.name)


def method_config(name: str, args) -> dict:
    """The settings recorded with a run of method ``name`` (``auto``: --test auto with an austerity option, or
    with default options where the model has no remainder bound; ``exact-subsampled-cv``: what --test auto
    chose for a model with one)."""
    if name == "auto":
        return {**method_config("austerity-cv", args), "chosen_by": "--test auto (the recommended method)"}
    if name in (THINNING, THINNING + "-cv"):
        return {"test": "exact subsampled MH (Poisson thinning of the Taylor remainders)",
                "control_variates": "Taylor, order 2, at the posterior mode"}
    if name == "recommended":
        return {**method_config(THINNING, args),
                "proposal": "crank-nicolson (Laplace approximation at the mode, rho adapted in warmup) or surrogate "
                            "MALA, chosen in warmup",
                "as": "the default of tallmh.sample and 'tallmh run' for this model"}
    if name.endswith("-cv"):
        return {**method_config(name[:-3], args), "control_variates": "Taylor, order 2, at the posterior mode"}
    if name == "austerity":
        if args.epsilon is not None:
            return {"epsilon": args.epsilon, "batch_size": args.batch_size}
        return {"error": 0.05 if args.error is None else args.error, "batch_size": args.batch_size}
    if name == "confidence":
        return {"delta": args.delta, "bound": args.bound, "p": 2.0, "gamma": args.gamma,
                "initial_batch": args.initial_batch}
    if name == "barker":
        return {"batch_size": args.barker_batch, "delta": args.barker_delta}
    return {"kind": "metropolis"}


def label_of(result, fallback):
    lab = getattr(result, "label", None)
    return str(lab) if lab else fallback
