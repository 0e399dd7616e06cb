"""One statistical check shared by every posterior test (and its negative controls)."""

import numpy as np
from scipy import stats

import arviz as az


def posterior_check(draws, true_mean, true_sd, p=0.01):
    """z-tests of each coordinate's mean and sd against the truth, with Monte Carlo standard errors.

    ``draws``: (chain, draw, d). The MCSEs come from ESS (ArviZ ``mcse`` of the mean and of the sd).
    Returns (ok, report); the family of 2 d tests is Bonferroni-corrected to level ``p``.
    """
    draws = np.asarray(draws, float)
    if draws.ndim == 2:
        draws = draws[..., None]
    d = draws.shape[-1]
    zcrit = stats.norm.isf(p / (2 * 2 * d))
    true_mean = np.broadcast_to(np.asarray(true_mean, float), (d,))
    true_sd = np.broadcast_to(np.asarray(true_sd, float), (d,))
    ok = True
    lines = []
    for j in range(d):
        x = draws[:, :, j]
        m_se = float(az.mcse(x, method="mean"))
        s_se = float(az.mcse(x, method="sd"))
        zm = (x.mean() - true_mean[j]) / m_se
        zs = (x.std(ddof=1) - true_sd[j]) / s_se
        ok &= abs(zm) < zcrit and abs(zs) < zcrit
        lines.append(f"[{j}] mean {x.mean():.5g} vs {true_mean[j]:.5g} (z {zm:+.2f}); "
                     f"sd {x.std(ddof=1):.4g} vs {true_sd[j]:.4g} (z {zs:+.2f}); crit {zcrit:.2f}")
    return bool(ok), "\n".join(lines)


def means_agree(a, b, p=0.01):
    """z-tests (Bonferroni over the columns) that two samplers' means agree: draws ``(chain, draw, d)`` each, each z
    with both Monte Carlo errors (``tallmh.diagnostics.mcse_mean``). Returns ``(all agree, the z values)``."""
    from tallmh.diagnostics import mcse_mean

    d = a.shape[-1]
    zcrit = stats.norm.isf(p / (2 * d))
    z = [(a[..., j].mean() - b[..., j].mean()) / np.hypot(mcse_mean(a[..., j]), mcse_mean(b[..., j]))
         for j in range(d)]
    return bool(np.all(np.abs(z) < zcrit)), np.round(z, 2)


def npy_files(tmp_path, data):
    """``data`` (a dict of arrays) written to one ``.npy`` file per key under ``tmp_path`` and opened with
    ``tm.data.from_npy``: the same rows, read from files."""
    import tallmh as tm

    paths = {k: str(tmp_path / f"{k}.npy") for k in data}
    for k, p in paths.items():
        np.save(p, data[k])
    return tm.data.from_npy(paths)
