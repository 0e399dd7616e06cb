"""The runner's draws on fixed seeds are those recorded before its code was reorganised.

``tests/data/draws_fixed_seeds.npz`` holds, for a few configurations of :func:`tallmh.sample` on a small
logistic regression (the default call, exact MH, austerity, Barker, the approximate default for models without
a remainder bound (austerity + control variates), and the default call and that one interrupted and resumed
from their saved results) and for an inference program on a mixture, every draw, acceptance and item
count of a short run. A change to the runner that
is meant to keep behaviour (a refactoring) must reproduce them exactly; a change meant to alter the
draws regenerates the file on purpose with ``TALLMH_WRITE_DRAWS=1 python -m pytest tests/test_same_draws.py``
(or ``TALLMH_WRITE_DRAWS=name,name`` for some configurations) and says so. Recorded with the jax/jaxlib versions stored in the file: with other versions XLA may round
differently, so the comparison then allows float differences of 1e-5 (a flipped decision still fails it).
"""

import os

import jax
import jaxlib
import numpy as np
import pytest

import tallmh as tm

PATH = os.path.join(os.path.dirname(__file__), "data", "draws_fixed_seeds.npz")


def _configs():
    A = tm.acceptance
    return {
        "default": dict(),
        "exact_am": dict(test=A.Exact()),
        "austerity_eps_cv": dict(test=A.Austerity(epsilon=0.05, batch_size=100),
                                 control_variates=tm.ControlVariates(order=2)),
        "barker": dict(test=A.Barker(batch_size=200)),
        "austerity_default": dict(test=A.Austerity(error=0.05), control_variates=tm.ControlVariates(order=2)),
        "program": "program",
        "resumed": "resumed",
        "resumed_default": "resumed_default",
    }


FAST = ("default", "exact_am", "program", "resumed", "resumed_default")


def _run(kw):
    if kw == "program":
        return _program()
    if kw == "resumed":  # (the austerity default: recorded when it was tm.sample's default)
        return _resumed(test=tm.acceptance.Austerity(error=0.05), control_variates=tm.ControlVariates(order=2))
    if kw == "resumed_default":
        return _resumed()
    data, _ = tm.models.LogisticRegression.simulate(3000, d=3, seed=7)
    return tm.sample(tm.models.LogisticRegression(), data, num_samples=150, num_warmup=100, num_chains=2,
                     seed=11, progress=False, audit=0.02, **kw)


def _program():
    from tallmh.blocks.models import TwoComponentMixture
    x = np.random.default_rng(5).normal(np.where(np.arange(40) % 3 == 0, -1.0, 1.5), 0.7).astype(np.float32)
    program = tm.Cycle([tm.blocks.MH("pi", scale=1.0), tm.blocks.Gibbs("z", items_per_step=len(x)),
                        tm.blocks.SubsampledMH("mu", test=tm.acceptance.Exact(chunk=8), scale=1.5,
                                               group_by="z")])
    return tm.sample(TwoComponentMixture(), x, program=program, num_samples=80, num_warmup=20, num_chains=2,
                     seed=3, progress=False, chunk_size=16)


def _resumed(**method):
    """The default call (or ``method``) stopped (as by Ctrl-C) after 60 draws, saved, loaded and resumed to the
    end."""
    import tempfile

    data, _ = tm.models.LogisticRegression.simulate(3000, d=3, seed=7)
    kw = dict(num_samples=150, num_warmup=100, num_chains=2, seed=11, progress=False, audit=0.02, **method)

    def stop(info):
        if info["phase"] == "sampling" and info["done"] >= 60:
            raise KeyboardInterrupt

    cut = tm.sample(tm.models.LogisticRegression(), data, callback=stop, chunk_size=30, **kw)
    assert cut.partial
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "cut.npz")
        cut.save(path)
        return tm.sample(tm.models.LogisticRegression(), data, resume=tm.load_result(path), **kw)


def _record(r):
    return {"samples": np.asarray(r.flat_samples), "warmup": np.asarray(r.flat_warmup),
            "accepted": np.asarray(r.stats["accepted"]), "n_data": np.asarray(r.stats["n_data"]),
            "audited": np.asarray(r.stats["audited"])}


def _write(only=None):
    """Record every configuration (or, with ``only``, add or replace those named, keeping the rest)."""
    out = {"jax": np.array(jax.__version__), "jaxlib": np.array(jaxlib.__version__)}
    if only is not None:
        out.update({k: v for k, v in np.load(PATH).items() if k.split("/")[0] not in only})
    for name, kw in _configs().items():
        if only is not None and name not in only:
            continue
        for k, v in _record(_run(kw)).items():
            out[f"{name}/{k}"] = v
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    np.savez_compressed(PATH, **out)


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in FAST else pytest.mark.slow)
                                  for n in _configs()])
def test_draws_on_fixed_seeds_are_unchanged(name):
    if os.environ.get("TALLMH_WRITE_DRAWS"):
        only = os.environ["TALLMH_WRITE_DRAWS"]
        if name == "default":
            _write(None if only == "1" else only.split(","))
        pytest.skip("fixture written")
    ref = np.load(PATH)
    same_versions = str(ref["jax"]) == jax.__version__ and str(ref["jaxlib"]) == jaxlib.__version__
    got = _record(_run(_configs()[name]))
    for k, v in got.items():
        want = ref[f"{name}/{k}"]
        assert v.shape == want.shape, k
        if v.dtype.kind == "f" and not same_versions:
            np.testing.assert_allclose(v, want, rtol=0, atol=1e-5, err_msg=f"{name}/{k}")
        else:
            np.testing.assert_array_equal(v, want, err_msg=f"{name}/{k}")


def test_the_comparison_sees_a_changed_seed():
    """Negative control: one seed off gives other draws, which the same comparison rejects."""
    ref = np.load(PATH)
    data, _ = tm.models.LogisticRegression.simulate(3000, d=3, seed=7)
    r = tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Exact(), num_samples=150,
                  num_warmup=100, num_chains=2, seed=12, progress=False, audit=0.02)
    assert not np.allclose(np.asarray(r.flat_samples), ref["exact_am/samples"], atol=1e-5)
