"""In-memory data is read in place, not copied (the target: peak memory <= data + 1 GB).

``tm.sample`` validates NumPy data with ``validate_data(..., in_place=True)``: on the CPU backend a
64-byte-aligned C-contiguous array becomes a ``jax.Array`` aliasing it, an unaligned one an
``InPlaceArray`` (a flat buffer aliasing the aligned span around it, plus an element offset); anything
else is copied as before. These tests check the aliasing, the values, the user's array's safety, and
that the draws are the same as with a copied array.
"""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tallmh as tm
from tallmh.storage import datasource as ds
from tallmh.storage.data import take, validate_data
from tallmh.errors import DataError

cpu_only = pytest.mark.skipif(jax.default_backend() != "cpu" or jax.device_count() != 1,
                              reason="in-place reading needs the CPU backend with one device")
COPY_BELOW = ds._COPY_BELOW_BYTES  # the default: smaller unaligned arrays are copied


@pytest.fixture(autouse=True)
def in_place_at_any_size(monkeypatch):
    """These tests exercise in-place reading on small arrays, which by default are copied (see
    test_small_unaligned_arrays_are_copied_large_ones_read_in_place)."""
    monkeypatch.setattr(ds, "_COPY_BELOW_BYTES", 0)


def at_offset(shape, dtype, off_bytes, fill=None):
    """A C-contiguous array whose address is ``off_bytes`` past a 64-byte boundary."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape)) * dtype.itemsize
    raw = np.empty(nbytes + 128, np.uint8)
    start = (off_bytes - raw.ctypes.data) % 64
    a = raw[start:start + nbytes].view(dtype).reshape(shape)
    assert a.ctypes.data % 64 == off_bytes
    a[...] = np.arange(a.size, dtype=dtype).reshape(shape) * 0.5 if fill is None else fill
    return a


@cpu_only
def test_aligned_array_is_aliased():
    X = at_offset((1000, 3), np.float32, 0)
    out = validate_data({"X": X}, in_place=True)["X"]
    assert isinstance(out, jax.Array)
    assert out.unsafe_buffer_pointer() == X.ctypes.data  # no copy
    np.testing.assert_array_equal(np.asarray(out), X)
    # without in_place (the default for other callers) it is copied, as before
    cp = validate_data({"X": X})["X"]
    assert cp.unsafe_buffer_pointer() != X.ctypes.data


@cpu_only
@pytest.mark.parametrize("off", [4, 16, 48])
def test_unaligned_array_is_read_in_place(off):
    X = at_offset((1000, 3), np.float32, off)
    y = at_offset((1000,), np.float32, off)
    out = validate_data({"X": X, "y": y}, in_place=True)
    for name, a in (("X", X), ("y", y)):
        leaf = out[name]
        assert isinstance(leaf, ds.InPlaceArray)
        assert leaf.buf.unsafe_buffer_pointer() == a.ctypes.data - off  # the aligned span, not a copy
        assert leaf.offset == off // 4 and leaf.shape == a.shape
        np.testing.assert_array_equal(np.asarray(leaf), a)
        np.testing.assert_array_equal(np.asarray(jnp.asarray(leaf)), a)
    assert ds.describe(out) == {"X": "in_place", "y": "in_place"}
    # gathers (eager and compiled, indices clipped like jnp.take(mode="clip")) give the rows
    idx = jnp.array([0, 999, 5, 5, -3, 1500, 123])
    ref = np.clip(np.asarray(idx), 0, 999)
    for fn in (take, jax.jit(take)):
        got = fn(out, idx)
        np.testing.assert_array_equal(np.asarray(got["X"]), X[ref])
        np.testing.assert_array_equal(np.asarray(got["y"]), y[ref])
    got = take(out, jnp.arange(12).reshape(3, 4))
    assert got["X"].shape == (3, 4, 3)
    np.testing.assert_array_equal(np.asarray(got["X"]), X[:12].reshape(3, 4, 3))
    np.testing.assert_array_equal(ds.read_rows(out, 10, 20)["X"], X[10:20])


@cpu_only
def test_small_unaligned_arrays_are_copied_large_ones_read_in_place(monkeypatch):
    # a small array's offset within 64 bytes depends on malloc; read in place, it would be part of the
    # compiled program, so a second process could miss the compilation cache: it is copied instead
    monkeypatch.setattr(ds, "_COPY_BELOW_BYTES", COPY_BELOW)
    small = at_offset((1000, 3), np.float32, 16)
    out = validate_data({"X": small}, in_place=True)["X"]
    assert isinstance(out, jax.Array) and out.unsafe_buffer_pointer() != small.ctypes.data
    np.testing.assert_array_equal(np.asarray(out), small)
    aligned = at_offset((1000, 3), np.float32, 0)  # aligned: aliased at any size (no offset in the program)
    assert validate_data({"X": aligned}, in_place=True)["X"].unsafe_buffer_pointer() == aligned.ctypes.data
    rows = COPY_BELOW // (4 * 3) + 1
    big = at_offset((rows, 3), np.float32, 16, 1.0)
    leaf = validate_data({"X": big}, in_place=True, check_finite=False)["X"]
    assert isinstance(leaf, ds.InPlaceArray) and leaf.buf.unsafe_buffer_pointer() == big.ctypes.data - 16


@cpu_only
def test_arrays_that_cannot_be_aliased_are_copied():
    X64 = at_offset((200, 3), np.float64, 0)  # x64 off: converted to float32, i.e. copied
    out = validate_data({"X": X64}, in_place=True)["X"]
    assert isinstance(out, jax.Array) and out.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out), X64.astype(np.float32))
    Xs = at_offset((200, 4), np.float32, 16)[:, ::2]  # not contiguous
    out = validate_data({"X": Xs}, in_place=True)["X"]
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), Xs)
    Xf = np.asfortranarray(at_offset((200, 3), np.float32, 0))  # Fortran order: copied (C order)
    out = validate_data({"X": Xf}, in_place=True)["X"]
    assert isinstance(out, jax.Array)
    np.testing.assert_array_equal(np.asarray(out), Xf)


@cpu_only
def test_alias_outlives_the_users_array():
    X = at_offset((5000, 3), np.float32, 16)
    ref = X.copy()
    leaf = validate_data({"X": X}, in_place=True)["X"]
    del X
    gc.collect()
    junk = [np.full(5000 * 3 + 32, -7.0, np.float32) for _ in range(20)]  # reuse of freed memory would show
    np.testing.assert_array_equal(np.asarray(jnp.asarray(leaf)), ref)
    np.testing.assert_array_equal(np.asarray(take({"X": leaf}, jnp.arange(5000))["X"]), ref)
    del junk


@cpu_only
def test_registry_does_not_pin_the_array():
    X = at_offset((100, 3), np.float32, 16)
    leaf = validate_data({"X": X}, in_place=True)["X"]
    key = id(leaf.buf)
    assert ds._ALIASED[key][1] is X
    del leaf
    gc.collect()
    assert key not in ds._ALIASED or ds._ALIASED[key][1] is not X


def test_nonfinite_in_memory_data_still_refused():
    X = at_offset((300, 3), np.float32, 16)
    X[7, 1] = np.nan
    X[9, 0] = np.inf
    with pytest.raises(DataError, match="holds 2 NaN or infinite"):
        validate_data({"X": X}, in_place=True)
    leaf = validate_data({"X": X}, check_finite=False, in_place=True)["X"]
    assert np.isnan(np.asarray(leaf)[7, 1])


class _MeanModel(tm.models.GaussianMean):
    """A model whose set-up statistic cannot be merged blockwise (not named *max*/*min*)."""

    def setup(self, data):
        return {"total": jnp.sum(jnp.asarray(data["x"]))}


@cpu_only
def test_setup_stats_in_place_match_whole_data(monkeypatch):
    monkeypatch.setattr(ds, "BLOCK_ROWS", 64)  # several blocks
    rng = np.random.default_rng(0)
    X = at_offset((1000, 3), np.float32, 16, rng.standard_normal((1000, 3)))
    y = at_offset((1000,), np.float32, 16, (rng.random(1000) < 0.5))
    model = tm.models.LogisticRegression()
    data = validate_data({"X": X, "y": y}, in_place=True)
    s = ds.setup_stats(model, data, 1000)
    ref = model.setup({"X": jnp.asarray(X), "y": jnp.asarray(y)})
    np.testing.assert_array_equal(np.asarray(s["max_norm"]), np.asarray(ref["max_norm"]))
    # not mergeable by name: the whole arrays are given to setup, as before
    x = at_offset((1000,), np.float32, 16, rng.standard_normal(1000))
    data = validate_data({"x": x}, in_place=True)
    s = ds.setup_stats(_MeanModel(), data, 1000)
    np.testing.assert_array_equal(np.asarray(s["total"]), np.asarray(jnp.sum(jnp.asarray(x))))


@cpu_only
@pytest.mark.parametrize("cv", [False, True])
def test_same_draws_as_a_copy_and_data_untouched(cv):
    rng = np.random.default_rng(2)
    n = 3000
    X = at_offset((n, 3), np.float32, 16, np.c_[np.ones(n), rng.standard_normal((n, 2))])
    y = at_offset((n,), np.float32, 48, rng.random(n) < 1 / (1 + np.exp(-(X @ np.array([0.2, -0.5, 1.0])))))
    X0, y0 = X.copy(), y.copy()
    kw = dict(test=tm.acceptance.Austerity(batch_size=100), num_chains=1, num_warmup=60, num_samples=40, seed=5,
              progress=False, control_variates=tm.ControlVariates() if cv else None)
    model = tm.models.LogisticRegression()
    r_in_place = tm.sample(model, {"X": X, "y": y}, **kw)
    r_copy = tm.sample(model, {"X": jnp.array(X), "y": jnp.array(y)}, **kw)  # JAX arrays: the old path
    np.testing.assert_array_equal(np.asarray(r_in_place.samples), np.asarray(r_copy.samples))
    np.testing.assert_array_equal(np.asarray(r_in_place.stats["n_data"]), np.asarray(r_copy.stats["n_data"]))
    a_in, a_cp = r_in_place.audit, r_copy.audit
    assert a_in["audit_steps"] > 0  # the audit (the full-data exact test) read the data in place too
    assert (a_in["audit_steps"], a_in["audit_wrong"]) == (a_cp["audit_steps"], a_cp["audit_wrong"])
    np.testing.assert_array_equal(X, X0)  # the user's arrays are not written to
    np.testing.assert_array_equal(y, y0)
