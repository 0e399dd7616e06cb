"""Worst-case step error of the austerity test (and the minibatch Barker test's acceptance bias) on skewed items.

For each population of per-item log-likelihood ratios l_i (Gaussian, exponential, log-normal(0, 1),
Bernoulli(0.02), Student-t(3); standardised to mean 0 and sd 1) and each N, the decision is put at the
design's worst case: the l_i sum to 0 and ``log_base = log(1/2)``, so exact MH accepts iff u < 1/2 and the
standardised gap stays ~0 at every look. For ``--keys`` keys, ``Austerity(error=e, batch_size=m)`` decides
and so does ``Exact()`` with the same u; a decision is wrong when they differ. Reported per row: the
wrong-decision rate with its 95% Wilson interval, whether it is within the target (the interval's lower end
at or below e), the mean data fraction, the mean estimated error inflation (``Decision.excess_error``) and
whether the verdict would flag it (``> tallmh.reporting.results.EXCESS_MAX``). The negative control is the symmetric
boundary (``skew_correction=False``), the boundary before the skewness correction.

The minibatch Barker rows scale the same items to sd ``0.5 sqrt(m) / N`` (so that the minibatch statistic's
variance ``(N sd)^2 / m`` is 1/4 at the first batch and the test can stop there) with the full log ratio at 0
(exact Barker acceptance probability 1/2), and report the acceptance bias ``mean(accept) - 1/2`` with its 95%
interval, against the test's bound ``delta``.

Usage::

    python benchmarks/skewed_items.py                      # N = 2e4 and 1e6; writes results/skewed_items.json
    python benchmarks/skewed_items.py --n 20000 --keys 1000 --out /tmp/x   # quicker
"""

from __future__ import annotations

import sys
import time

import numpy as np

import _common as C

KINDS = ("gaussian", "exponential", "lognormal", "bernoulli02", "student_t3")


def population(kind, n, seed=0):
    rng = np.random.default_rng(seed)
    v = {"gaussian": lambda: rng.standard_normal(n), "exponential": lambda: rng.exponential(size=n),
         "lognormal": lambda: np.exp(rng.standard_normal(n)), "bernoulli02": lambda: (rng.random(n) < 0.02) * 1.0,
         "student_t3": lambda: rng.standard_t(3, n)}[kind]()
    v = v - v.mean()
    return (v / v.std()).astype(np.float32)


def main(argv=None):
    ap = C.parser(__doc__)
    ap.add_argument("--n", default="20000,1000000", help="comma-separated N")
    ap.add_argument("--keys", default="4000,1000", help="keys per N (comma-separated, one per N)")
    ap.add_argument("--batch-size", type=int, default=500)
    ap.add_argument("--error", type=float, default=0.05)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--out", default=C.RESULTS)
    args = ap.parse_args(argv)

    import jax
    import jax.numpy as jnp

    import tallmh as tm
    from tallmh.acceptance.base import Problem
    from tallmh.reporting.results import EXCESS_MAX, _wilson

    def decider(test, log_base):
        def run(values, keys):
            problem = Problem(values.shape[0], jnp.asarray(log_base, values.dtype), lambda idx: values[idx], None, None)
            return jax.vmap(lambda k: test.decide(k, problem))(keys)
        return jax.jit(run)

    meta = C.machine_info(sys.argv)
    ns = C.numbers(args.n, int)
    ks = C.numbers(args.keys, int)
    rows = []
    m, e = args.batch_size, args.error
    print(f"{'N':>8} {'items':<12} {'boundary':<10} {'wrong':>7} {'95% CI':>15} {'within':>6} {'data':>6} "
          f"{'excess':>7} {'flagged':>7}")
    for n, nk in zip(ns, ks):
        keys = jax.random.split(jax.random.PRNGKey(0), nk)
        for kind in args.kinds.split(","):
            v = jnp.asarray(population(kind, n))
            ref = np.asarray(decider(tm.acceptance.Exact(), np.log(0.5))(v, keys).accept)
            for name, test in (("corrected", tm.acceptance.Austerity(error=e, batch_size=m)),
                               ("symmetric", tm.acceptance.Austerity(error=e, batch_size=m, skew_correction=False))):
                t0 = time.perf_counter()
                d = decider(test, np.log(0.5))(v, keys)
                nd = np.asarray(d.n_data)
                wrong = int(np.sum(np.asarray(d.accept) != ref))
                lo, hi = _wilson(wrong, nk)
                sub = (nd > 0) & (nd < n)
                excess = float(np.mean(np.asarray(d.excess_error)[sub])) if sub.any() else 0.0
                row = dict(test="austerity", N=n, items=kind, boundary=name, keys=nk, batch=m, target=e,
                           wrong_rate=wrong / nk, ci=[lo, hi], within=bool(lo <= e), data_fraction=float(nd.mean() / n),
                           excess=excess, flagged=bool(excess > EXCESS_MAX), seconds=time.perf_counter() - t0)
                rows.append(row)
                print(f"{n:>8} {kind:<12} {name:<10} {wrong / nk:>7.4f} {lo:>7.4f}-{hi:<7.4f} "
                      f"{'yes' if row['within'] else 'NO':>6} {row['data_fraction']:>6.3f} {excess:>7.3f} "
                      f"{'yes' if row['flagged'] else 'no':>7}", flush=True)
            bk = tm.acceptance.Barker(batch_size=m)
            d = decider(bk, 0.0)(v * (0.5 * np.sqrt(m) / n), keys)
            acc = np.asarray(d.accept, float)
            bias = float(acc.mean() - 0.5)
            half = 1.96 * float(acc.std(ddof=1)) / np.sqrt(nk)
            row = dict(test="barker", N=n, items=kind, keys=nk, batch=m, delta=bk.delta, bias=bias,
                       ci=[bias - half, bias + half], within=bool(abs(bias) - half <= bk.delta),
                       data_fraction=float(np.asarray(d.n_data).mean() / n))
            rows.append(row)
            print(f"{n:>8} {kind:<12} {'barker':<10} bias {bias:+.4f} (95% CI {bias - half:+.4f} to {bias + half:+.4f}), "
                  f"bound {bk.delta:g}, data {row['data_fraction']:.3f}", flush=True)
    C.write_json(args.out, "skewed_items.json", {"meta": meta, "rows": rows})


if __name__ == "__main__":
    main()
