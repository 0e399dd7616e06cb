"""The swap-or-not permutation behind subsampling: a bijection for every N, with uniform prefixes.

Statistical checks use fixed seeds, tolerances from the Monte Carlo standard error, and negative controls
(the identity, and the same shuffle cut to one round or to its opening reflection) that must fail them.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import tallmh.storage.data as D
from tallmh.storage.data import make_permutation, permute


def _pi(key, positions, n):
    return np.asarray(permute(make_permutation(key), jnp.asarray(positions), n))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 17, 4**5, 4**5 + 1, 4**8, 4**8 + 1, 7919, 65_521])
def test_bijection_for_every_n(n):
    for seed in range(2):
        idx = _pi(jax.random.PRNGKey(seed), np.arange(n), n)
        assert np.array_equal(np.sort(idx), np.arange(n)), n


def test_traced_n_is_a_bijection_and_agrees_with_static_n():
    perm = make_permutation(jax.random.PRNGKey(5))
    f = jax.jit(lambda n: permute(perm, jnp.arange(70, dtype=jnp.int32), n))
    for n in [1, 2, 3, 16, 17, 64, 70]:
        got = np.asarray(f(jnp.int32(n)))[:n]
        assert np.array_equal(np.sort(got), np.arange(n)), n
        assert np.array_equal(got, np.asarray(permute(perm, jnp.arange(n), n)))
    # an empty population (n = 0) still returns in-range indices (callers mask them)
    assert np.all(np.asarray(f(jnp.int32(0))) == 0)


def test_vmap_over_keys_and_sizes():
    keys = jax.random.split(jax.random.PRNGKey(2), 6)
    ns = jnp.array([1, 5, 9, 16, 17, 33], jnp.int32)
    out = np.asarray(jax.jit(jax.vmap(lambda k, n: permute(make_permutation(k), jnp.arange(33), n)))(keys, ns))
    for row, n in zip(out, np.asarray(ns)):
        assert np.array_equal(np.sort(row[:n]), np.arange(n))


# --- an independent reference in Python integers: checks the uint32 arithmetic up to N = 2**31 - 1 -------

def _mix32_ref(x):
    m = 0xFFFFFFFF
    x ^= x >> 16
    x = (x * 0x7FEB352D) & m
    x ^= x >> 15
    x = (x * 0x846CA68B) & m
    x ^= x >> 16
    return x


def _permute_ref(round_keys, x, n):
    hi, lo, fk = (np.asarray(round_keys[i], np.uint64).astype(object) for i in range(3))
    k = [int(h) * 2**32 + int(l) for h, l in zip(hi, lo)]
    k = [v * n >> 64 for v in k]
    x = (k[0] - x) % n
    for r in range(1, len(k)):
        xp = (k[r] - x) % n
        if _mix32_ref(max(x, xp) ^ int(fk[r])) >> 31:
            x = xp
    return x


def test_wide_products_and_round_offsets_are_exact():
    rng = np.random.default_rng(1)
    a = np.r_[0, 1, 2**16, 2**32 - 1, 2**31 - 1, rng.integers(0, 2**32, 200)].astype(np.uint32)
    b = np.r_[2**32 - 1, 2**32 - 1, 2**16 - 1, 2**32 - 1, 2**31 - 1, rng.integers(0, 2**32, 200)].astype(np.uint32)
    hi, lo = (np.asarray(v) for v in D._mul_wide(jnp.asarray(a), jnp.asarray(b)))
    want = [int(x) * int(y) for x, y in zip(a, b)]
    assert [int(h) * 2**32 + int(l) for h, l in zip(hi, lo)] == want
    for n in [1, 2, 3, 1000, 2**31 - 1]:
        k = np.asarray(D._scale64(jnp.asarray(a), jnp.asarray(b), jnp.uint32(n)))
        assert [int(v) for v in k] == [(int(x) * 2**32 + int(y)) * n >> 64 for x, y in zip(a, b)]


@pytest.mark.parametrize("n", [7, 4**10 + 1, 3 * 2**29, 2**31 - 2, 2**31 - 1])
def test_matches_integer_reference_without_overflow(n):
    perm = make_permutation(jax.random.PRNGKey(11))
    pos = np.unique(np.r_[np.arange(min(n, 40)), n - 1 - np.arange(min(n, 40)), np.random.default_rng(0).integers(0, n, 40)])
    got = np.asarray(permute(perm, jnp.asarray(pos, jnp.int32), n))
    want = np.array([_permute_ref(np.asarray(perm.round_keys), int(p), n) for p in pos])
    assert np.array_equal(got, want)
    assert got.min() >= 0 and got.max() < n and len(np.unique(got)) == len(got)


def test_large_n_chunk_has_no_repeats():
    n = 2**31 - 1
    out = _pi(jax.random.PRNGKey(4), np.arange(100_000), n)
    assert out.min() >= 0 and out.max() < n and len(np.unique(out)) == len(out)


# --- statistical quality: the first m positions are a uniform random subset, pairs near-independent -----

_N, _M, _DRAWS = 101, 10, 20_000


def _prefixes(rounds=None, identity=False, monkeypatch=None):
    if rounds is not None:
        monkeypatch.setattr(D, "_SWAP_ROUNDS", rounds)
    keys = jax.random.split(jax.random.PRNGKey(123), _DRAWS)
    if identity:
        return np.broadcast_to(np.arange(_M), (_DRAWS, _M))
    f = jax.jit(jax.vmap(lambda k: D.permute(D.make_permutation(k), jnp.arange(_M), _N)))
    return np.asarray(f(keys))


def _inclusion_pvalue(pre):
    # Counts of each item in the prefix over independent keys. Under uniform subsets without replacement
    # the counts have covariance D p (1 - p) N/(N-1) (I - J/N), p = m/N, so this statistic is chi2(N - 1).
    counts = np.bincount(pre.ravel(), minlength=_N)
    p = _M / _N
    stat = np.sum((counts - _DRAWS * p) ** 2) / (_DRAWS * p * (1 - p) * _N / (_N - 1))
    return stats.chi2.sf(stat, _N - 1)


def _neighbour_z(pre, gap=1):
    # How often items i and i + gap (i < N - gap) are both in the prefix: per draw expected
    # (N - gap) m (m - 1) / (N (N - 1)). z = (mean - expected) / MCSE over the independent draws.
    inside = np.zeros((_DRAWS, _N), bool)
    np.put_along_axis(inside, pre, True, axis=1)
    both = np.sum(inside[:, :-gap] & inside[:, gap:], axis=1)
    want = (_N - gap) * _M * (_M - 1) / (_N * (_N - 1))
    return (both.mean() - want) / (both.std(ddof=1) / np.sqrt(_DRAWS))


def test_prefix_is_a_uniform_subset_and_pairs_are_independent():
    pre = _prefixes()
    for row in pre[:50]:
        assert len(np.unique(row)) == _M
    assert _inclusion_pvalue(pre) > 1e-3
    # five tests at level 1e-3 each (Bonferroni): |z| < 3.9
    for gap in (1, 2, 5, 50):
        assert abs(_neighbour_z(pre, gap)) < 3.9, gap


def test_negative_controls_fail_the_same_checks(monkeypatch):
    # the identity: the prefix is always items 0..m-1
    assert _inclusion_pvalue(_prefixes(identity=True)) < 1e-6
    # the opening reflection alone (x -> K - x mod N): every item is uniform in the prefix (so the
    # inclusion check passes), but the prefix is a window of neighbours, which the pair check sees
    pre = _prefixes(rounds=0, monkeypatch=monkeypatch)
    assert _inclusion_pvalue(pre) > 1e-3
    assert _neighbour_z(pre, 1) > 20
    # one swap-or-not round on top: still far too many neighbours together
    pre = _prefixes(rounds=1, monkeypatch=monkeypatch)
    assert _neighbour_z(pre, 1) > 20
    # four rounds: pairs (i, i + 1) survive together with probability ~ 2**-4, still visible at this size
    pre = _prefixes(rounds=4, monkeypatch=monkeypatch)
    assert _neighbour_z(pre, 1) > 3.9


def _prefix_mean_variance_ratio(monkeypatch=None, rounds=None, n=10_007, m=100, draws=20_000):
    # Data stored in sorted order (l_i = i), the worst case for a shuffle that keeps neighbours together:
    # the variance of the mean of the first m items, over keys, against simple random sampling without
    # replacement, sigma^2 / m * (N - m) / (N - 1). Returns (ratio, its Monte Carlo standard error).
    if rounds is not None:
        monkeypatch.setattr(D, "_SWAP_ROUNDS", rounds)
    keys = jax.random.split(jax.random.PRNGKey(7), draws)
    f = jax.jit(jax.vmap(lambda k: jnp.mean(D.permute(D.make_permutation(k), jnp.arange(m), n).astype(jnp.float32))))
    means = np.asarray(f(keys), np.float64)
    sigma2 = (n**2 - 1) / 12.0
    want = sigma2 / m * (n - m) / (n - 1)
    ratio = means.var(ddof=1) / want
    # the mean of m items is close to normal, so var(sample variance) / variance^2 ~ 2 / (draws - 1)
    return ratio, ratio * np.sqrt(2.0 / (draws - 1))


def test_minibatch_mean_of_sorted_data_has_the_srswor_variance(monkeypatch):
    ratio, se = _prefix_mean_variance_ratio()
    assert abs(ratio - 1.0) < 4 * se, (ratio, se)
    # negative control: 8 rounds keep each pair of positions together with probability ~ 2**-8, which
    # inflates the variance by about (m - 1) / 256 ~ 40% on sorted data
    ratio8, se8 = _prefix_mean_variance_ratio(monkeypatch, rounds=8)
    assert ratio8 - 1.0 > 4 * se8, (ratio8, se8)


def test_a_read_computes_the_rounds_once_for_all_data_leaves():
    """The permuted positions are computed once per read, not fused into the gather of every leaf (X, y):
    counted in the optimised program by the round function's multiplier constant. Negative control: an
    unguarded hash of the positions feeding two gathers appears twice (with 3 rounds: XLA 0.12's CPU
    compiler takes minutes over the duplicated fusion of all 33). The guard changes no position."""
    n = 50_000
    X = jnp.zeros((n, 3), jnp.float32)
    y = jnp.zeros((n,), jnp.float32)
    perm = D.make_permutation(jax.random.PRNGKey(0))
    mult = str(0x7FEB352D)

    start = jnp.int32(7)

    def read(perm, start, X, y):
        idx = D.permute(perm, start + jnp.arange(64, dtype=jnp.int32), n)
        return X[idx] @ jnp.ones(3) + y[idx]

    def unguarded_positions(perm, start, rounds):  # the same rounds without the last (no-op) remainder
        x = (start + jnp.arange(64, dtype=jnp.int32)).astype(jnp.uint32)
        nn = jnp.uint32(n)
        k = D._scale64(perm.round_keys[0], perm.round_keys[1], nn)
        for r in range(rounds):
            d = k[r] - x
            xp = jnp.where(k[r] >= x, d, d + nn)
            bit = D._mix32(jnp.maximum(x, xp) ^ perm.round_keys[2][r]) >> 31
            x = xp if r == 0 else jnp.where(bit == 1, xp, x)
        return x.astype(jnp.int32)

    def unguarded(perm, start, X, y):
        idx = unguarded_positions(perm, start, 3)
        return X[idx] @ jnp.ones(3) + y[idx]

    assert jax.jit(read).lower(perm, start, X, y).compile().as_text().count(mult) == 1
    assert jax.jit(unguarded).lower(perm, start, X, y).compile().as_text().count(mult) >= 2
    positions = jax.jit(lambda p, s: D.permute(p, s + jnp.arange(64, dtype=jnp.int32), n))(perm, start)
    want = jax.jit(lambda p, s: unguarded_positions(p, s, D._SWAP_ROUNDS + 1))(perm, start)
    np.testing.assert_array_equal(np.asarray(positions), np.asarray(want))
    Xr = X + jnp.arange(3 * n, dtype=jnp.float32).reshape(n, 3)
    np.testing.assert_array_equal(np.asarray(jax.jit(read)(perm, start, Xr, y)),
                                  np.asarray(Xr[want] @ jnp.ones(3) + y[want]))


def test_unrolled_threefry_gives_the_same_bits_only_in_its_own_thread():
    import threading

    from tallmh import _lowering
    from tallmh._lowering import unrolled_threefry

    key = jax.random.PRNGKey(3)
    f = lambda k: (D.make_permutation(k).round_keys, jax.random.normal(k, (5,)))  # noqa: E731
    plain = jax.jit(f).lower(key).as_text()
    if not _lowering.measured_here():
        # not where it was not measured (jax 0.12 compiled some programs lowered so for over 10 minutes)
        with unrolled_threefry():
            assert jax.jit(lambda k: f(k)).lower(key).as_text().replace("_lambda", "f") == plain.replace("_lambda", "f")
        return
    want = jax.jit(f).lower(key).compile()(key)
    other = {}
    inside, release = threading.Event(), threading.Event()

    def lower_elsewhere():  # another thread lowers while the block is open in this one
        inside.wait()
        other["text"] = jax.jit(lambda k: f(k)).lower(key).as_text()
        release.set()

    t = threading.Thread(target=lower_elsewhere)
    t.start()
    with unrolled_threefry():
        lowered = jax.jit(lambda k: f(k)).lower(key)
        inside.set()
        release.wait()
    t.join()
    unrolled = lowered.as_text()
    assert unrolled != plain  # the block changes this thread's lowering (negative control of the next line)
    assert other["text"].replace("_lambda", "f") == plain.replace("_lambda", "f")
    assert jax.jit(f).lower(key).as_text() == plain  # and nothing after the block
    got = lowered.compile()(key)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_unrolled_threefry_matches_jax_on_batched_keys_and_any_shape():
    """The unrolled hash (emitted by tallmh's own rule) gives JAX's bits for keys broadcast against their counts
    (chains' keys under vmap), several shapes and none."""
    from tallmh import _lowering
    from tallmh._lowering import unrolled_threefry

    if not _lowering.measured_here():
        pytest.skip("the unrolled form is used only with the jax versions where it was measured")
    keys = jax.random.split(jax.random.PRNGKey(11), 4)

    def f(ks):
        return (jax.vmap(lambda k: jax.random.normal(k, (11,)))(ks), jax.vmap(lambda k: jax.random.split(k, 3))(ks),
                jax.random.bits(ks[0], (7, 5), jnp.uint32), jax.vmap(lambda k: jax.random.uniform(k, ()))(ks),
                jax.random.bits(ks[1], (0,), jnp.uint32), jax.random.exponential(ks[2], (2, 1)))

    want = jax.jit(f)(keys)
    with unrolled_threefry():
        lowered = jax.jit(lambda ks: f(ks)).lower(keys)
    assert "while" in jax.jit(f).lower(keys).as_text() and "while" not in lowered.as_text()  # (the rule was used)
    got = lowered.compile()(keys)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert a.shape == b.shape
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
