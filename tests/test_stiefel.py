"""The Stiefel random walk (austerity paper Sec. 5.2) and the ICA model.

- the walk keeps W W^T = I to 1e-5 over a long chain;
- its rotation angle has the law the paper's description implies (projected normal), which is even: the
  walk is symmetric; a walk with a drift in the angle (negative control) fails the same check;
- under a flat target, through tm.sample and the unmodified kernel, the chain is uniform (Haar) on
  SO(3): moments of tr W and W_11 match their Haar values within Monte Carlo error; a slightly tilted
  target exp(0.3 tr W) (negative control) fails the same check;
- the ICA log-likelihood, prior support and Amari distance.
"""

import math

import arviz as az
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import integrate, stats

import tallmh as tm
from tallmh.errors import ConfigError
from tallmh.models.ica import amari_distance, whiten
from tallmh.proposals.stiefel import rotation_angle_density


def haar_so(d, n, seed):
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((n, d, d)))
    q = q * np.sign(np.diagonal(r, axis1=1, axis2=2))[:, None, :]
    flip = np.linalg.det(q) < 0
    q[flip, :, 0] *= -1
    return q


def walk_chain(walk, w0, steps, seed):
    """Iterate the proposal alone (what MH does under a flat target: every move is accepted)."""
    flat0 = jnp.asarray(w0, jnp.float32).reshape(-1)
    st = walk.init(flat0, 1)

    def body(th, k):
        thp, lq = walk.propose(k, th, st)
        return thp, (thp, lq)

    _, (ths, lqs) = jax.lax.scan(body, flat0, jax.random.split(jax.random.PRNGKey(seed), steps))
    d = int(math.isqrt(flat0.shape[0]))
    return np.asarray(ths).reshape(steps, d, d), np.asarray(lqs)


def test_walk_keeps_orthogonality():
    w0 = haar_so(5, 1, 0)[0]
    ws, lq = walk_chain(tm.proposals.StiefelWalk(psi=1.0), w0, 20000, seed=1)
    err = np.abs(np.einsum("sij,skj->sik", ws, ws) - np.eye(5)).max()
    assert err < 1e-5, err
    assert np.all(lq == 0)  # symmetric: log q ratio 0
    assert np.allclose(np.linalg.det(ws), 1.0, atol=1e-4)  # the walk keeps det W


def _angles(walk, w, keys, extra_angle=0.0):
    """Rotation angle of each proposal from ``w``, checking that exactly one row pair turned in its plane."""
    flat = jnp.asarray(w, jnp.float32).reshape(-1)
    st = walk.init(flat, 1)
    props = np.asarray(jax.vmap(lambda k: walk.propose(k, flat, st)[0])(keys), float)
    d = w.shape[0]
    out = []
    for p in props.reshape(-1, d, d):
        g = p @ w.T  # W' = G W
        moved = np.where(np.abs(np.diag(g) - 1.0) > 1e-6)[0]
        if len(moved) == 0:
            out.append(0.0)
            continue
        assert len(moved) == 2, moved
        j, k = moved
        # G acts on (w_j, w_k) as a rotation [[c, s], [-s, c]] (or its transpose, if the roles swap)
        assert abs(g[j, j] - g[k, k]) < 1e-5 and abs(g[j, k] + g[k, j]) < 1e-5
        rest = np.delete(np.delete(g, [j, k], 0), [j, k], 1)
        assert np.allclose(rest, np.eye(d - 2), atol=1e-5)
        phi = math.atan2(g[j, k], g[j, j])
        out.append(phi + extra_angle)
    return np.array(out)


def _angle_cdf(psi):
    grid = np.linspace(-math.pi, math.pi, 4001)
    dens = rotation_angle_density(grid, psi)
    cdf = np.concatenate([[0.0], np.cumsum(0.5 * (dens[1:] + dens[:-1]) * np.diff(grid))])
    return lambda x: np.interp(x, grid, cdf / cdf[-1])


@pytest.mark.parametrize("psi", [0.0, 0.7, 3.0])
def test_angle_law_is_the_projected_normal_and_even(psi):
    """The move is a Givens rotation whose angle has the even density f_psi: q(W'|W) = q(W|W')."""
    total, _ = integrate.quad(lambda x: rotation_angle_density(x, psi), -math.pi, math.pi)
    assert abs(total - 1.0) < 1e-6
    xs = np.linspace(0.01, 3.1, 50)
    assert np.allclose(rotation_angle_density(xs, psi), rotation_angle_density(-xs, psi))
    w = haar_so(4, 1, 3)[0]
    keys = jax.random.split(jax.random.PRNGKey(7), 3000)
    # the angle of the pair (j, k) is phi or -phi depending on which row was discarded; f is even, so the
    # law of the signed angle in G's orientation is f itself
    phis = _angles(tm.proposals.StiefelWalk(psi), w, keys)
    cdf = _angle_cdf(psi)
    p = stats.kstest(phis, cdf).pvalue
    assert p > 1e-3, p
    # symmetry: the reverse move has angle -phi; its law is the same
    assert stats.kstest(-phis, cdf).pvalue > 1e-3
    # negative control: a walk whose angle drifts by +0.25 rad is not symmetric and fails the same check
    bad = _angles(tm.proposals.StiefelWalk(psi), w, keys, extra_angle=0.25)
    assert stats.kstest(bad, cdf).pvalue < 1e-6


def _flat_model(kappa=0.0):
    """Target on SO(3): exp(kappa tr W) (kappa = 0: uniform); the items carry no information."""
    return tm.Model(log_prior=lambda W: kappa * jnp.trace(W),
                    log_lik=lambda W, batch: jnp.zeros(batch["x"].shape[0]), name=f"flat-{kappa}")


def _haar_moments_check(draws, p=1e-3):
    """z-tests (ArviZ MCSE, Bonferroni over 5 statistics) of Haar moments on SO(3).

    Haar on SO(3): E tr W = 0, E (tr W)^2 = 1, E W_11 = 0, E W_11^2 = 1/3, E W_11^4 = 3/15.
    """
    tr = np.trace(draws, axis1=-2, axis2=-1)
    w11 = draws[..., 0, 0]
    stats_ = {"tr": (tr, 0.0), "tr^2": (tr**2, 1.0), "W11": (w11, 0.0), "W11^2": (w11**2, 1 / 3),
              "W11^4": (w11**4, 0.2)}
    zcrit = stats.norm.isf(p / (2 * len(stats_)))
    zs = {}
    for name, (x, truth) in stats_.items():
        se = float(az.mcse(np.asarray(x, float), method="mean"))
        zs[name] = (float(x.mean()) - truth) / se
    return all(abs(z) < zcrit for z in zs.values()), zs


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_uniform_on_so3_under_flat_target_through_sample():
    data = {"x": np.zeros((8, 1), np.float32)}
    res = {}
    for kappa in (0.0, 0.3):  # 0.3: negative control
        r = tm.sample(_flat_model(kappa), data, test=tm.acceptance.Exact(), proposal=tm.proposals.StiefelWalk(0.5),
                      num_samples=3000, num_warmup=200, num_chains=4, seed=5, init=jnp.eye(3), progress=False)
        res[kappa] = np.asarray(r.samples, float)
    w = res[0.0]
    assert np.abs(np.einsum("cdij,cdkj->cdik", w, w) - np.eye(3)).max() < 1e-5
    ok, zs = _haar_moments_check(w)
    assert ok, zs
    bad, zs_bad = _haar_moments_check(res[0.3])
    assert not bad, zs_bad
    # and the same statistics on exact Haar draws pass (the check itself is calibrated)
    ok_iid, _ = _haar_moments_check(haar_so(3, 12000, 2).reshape(4, 3000, 3, 3))
    assert ok_iid


def test_flat_target_uniform_quick():
    """Quick version without tm.sample: the walk alone (MH under a flat target accepts every move)."""
    ws, _ = walk_chain(tm.proposals.StiefelWalk(psi=0.5), np.eye(3), 16000, seed=4)
    ok, zs = _haar_moments_check(ws.reshape(4, 4000, 3, 3))
    assert ok, zs


def test_stiefel_walk_errors():
    with pytest.raises(ConfigError):
        tm.proposals.StiefelWalk(psi=-1.0)
    with pytest.raises(ConfigError):
        tm.proposals.StiefelWalk(psi=1.0).init(jnp.zeros(5), 10)  # not a square matrix
    with pytest.raises(ConfigError):
        tm.proposals.StiefelWalk(psi=1.0).init(jnp.ones(9), 10)  # not orthogonal
    with pytest.raises(ConfigError):
        tm.proposals.StiefelWalk(psi=1.0, shape=(2, 3))


def test_ica_log_lik_prior_and_amari():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((50, 3))
    Xw, V, _ = whiten(X)
    assert np.allclose(Xw.T @ Xw / 50, np.eye(3), atol=1e-10)
    W = haar_so(3, 1, 1)[0]
    m = tm.models.ICA()
    ll = np.asarray(m.log_lik(jnp.asarray(W), {"X": jnp.asarray(Xw)}), float)
    ref = np.log(abs(np.linalg.det(W))) - np.sum(np.log(4 * np.cosh(Xw @ W.T / 2) ** 2), axis=1)
    assert np.allclose(ll, ref, atol=1e-4)
    assert float(m.log_prior(jnp.asarray(W))) == 0.0
    assert float(m.log_prior(jnp.asarray(1.01 * W))) == -np.inf
    # Amari distance: 0 at W0, invariant to row permutation and sign, in [0, 1]
    W0 = rng.standard_normal((3, 3))
    assert abs(amari_distance(W0, W0)) < 1e-12
    perm = W0[[2, 0, 1]] * np.array([[-1.0], [2.0], [0.5]])
    assert abs(amari_distance(perm, W0)) < 1e-12
    dist = amari_distance(haar_so(3, 100, 3), W0)
    assert np.all((dist >= 0) & (dist <= 1)) and dist.mean() > 0.1


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_ica_needs_whitened_data_and_rejects_euclidean_moves():
    with pytest.raises(tm.DataError):
        tm.models.ICA().setup({"X": 3.0 * np.random.default_rng(0).standard_normal((100, 2))})
    data, _ = tm.models.ICA.simulate(300, seed=0)
    r = tm.sample(tm.models.ICA(), data, proposal=tm.proposals.RandomWalk(0.01), num_samples=50, num_warmup=0,
                  num_chains=1, init=jnp.eye(4), progress=False)
    assert not r.stats["accepted"].any()  # off the manifold: prior 0, rejected without reading data
    assert int(r.stats["n_data"].sum()) == 0
