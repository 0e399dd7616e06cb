"""The verdict's CLT check: it fires on heavy-tailed log-likelihood ratios (log-normal data under a Gaussian
model, the adaptive-subsampling paper's Fig. 4 case) and stays quiet on normal data (issue 8, item 4)."""

import warnings

import numpy as np
import pytest

import tallmh as tm

warnings.filterwarnings("ignore", category=tm.TrustWarning)


def _run(x, test):
    return tm.sample(tm.models.Gaussian(), {"x": x.astype(np.float32)}, test=test, num_chains=2, num_warmup=300,
                     num_samples=300, seed=0, progress=False, audit=0.0)


@pytest.mark.slow
def test_clt_check_fires_on_lognormal_not_on_normal():
    # (The minibatch Barker test reads most of the data on this posterior, where the bound is small and
    # its answer was accurate in benchmarks/trust.py: the check concerns the batch sizes a test stops at.)
    test = tm.acceptance.Austerity(batch_size=100)
    z = np.random.default_rng(1).standard_normal(20_000)
    normal = _run(z, test)
    lognormal = _run(np.exp(z), test)
    assert normal.clt_error < tm.results.CLT_DOUBT
    assert not any(w.startswith("CLT doubt") for w in normal.warnings)
    assert lognormal.clt_error > tm.results.CLT_DOUBT
    assert any(w.startswith("CLT doubt") for w in lognormal.warnings)
    assert not lognormal.trusted
