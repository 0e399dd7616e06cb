"""The design matrix of ``tallmh run`` as the sampler sees it, and the way back to the data's own scale.

Features are standardised (``x_std = (x - center) / scale``) and a column of ones comes first unless the
run says otherwise; the coefficients sampled on that scale map back linearly: ``beta_j = b_j / scale_j``
and ``intercept = b_0 - sum_j b_j center_j / scale_j``. A table small enough for memory is read whole
(:func:`load_design`); a larger one, or any 2-D ``.npy``, is streamed into an on-disk cache
(:mod:`tallmh.frontends.design_cache`).
"""

from __future__ import annotations

import numpy as np

from ..errors import DataError

from ..method_options import batch_of
from .tables import scaling_of, split_features

__all__ = ["split_features", "scaling_of", "load_design", "extra_parameter_of", "original_scale",
           "original_scale_run", "original_scale_laplace"]


def load_design(args):
    """The table as the sampler sees it (standardised, with an intercept) and how to undo that.

    Returns ``(X float32, y float32, names, scaling)``: ``scaling = {"center": [...], "scale": [...],
    "intercept": bool}`` over the feature columns (the intercept excluded). Without an intercept the
    features are only scaled, so the model keeps no intercept on the original scale.
    """
    from ..datasets import load_table

    test_batch = batch_of(args.test, args)
    if getattr(args, "formula", None):
        from .formula import load_design as load_formula

        t = load_formula(args.data, args.formula, args.family, min_rows=test_batch)
        Z, names, yv, has_intercept = t.X, list(t.names), t.y, t.intercept
    else:
        t = load_table(args.data, args.target, split_features(args.features),
                       binary_target=(args.model == "logistic"), min_rows=test_batch, standardise=False,
                       intercept=False)
        Z, names, yv, has_intercept = t.X.astype(np.float64), list(t.feature_names), t.y, True
    from .degenerate import binary_target, check_target, design_notes

    target = t.target if getattr(args, "formula", None) else args.target
    check_target(yv, target)
    if len(Z):
        const = np.flatnonzero(np.all(Z == Z[0], axis=0))
        if const.size:  # (before standardising: its sd is 0, and a huge constant is no NaN of the data's)
            raise DataError(f"feature {names[const[0]]!r} is constant (every row is {Z[0, const[0]]:g}); drop it")
    intercept = not args.no_intercept and has_intercept
    notes = design_notes(Z, yv, names, target, binary=binary_target(args), intercept=intercept)
    features = list(names)
    mean = Z.mean(axis=0)
    sd = Z.std(axis=0)
    if args.no_standardize:
        center, scale = np.zeros_like(mean), np.ones_like(sd)
    else:
        center, scale = (mean if intercept else np.zeros_like(mean)), sd
    Z = (Z - center) / scale
    if intercept:
        Z = np.column_stack([np.ones(len(Z)), Z])
        names = ["intercept"] + names
    scaling = scaling_of(not args.no_standardize, intercept, features, center, scale)
    scaling["data_notes"] = notes  # (said before sampling, in the summary and in results.json)
    return Z.astype(np.float32), yv.astype(np.float32), names, scaling


def extra_parameter_of(model):
    """``(sampled name, reported name)`` of a regression's parameter after the coefficients, sampled on the
    log scale and reported as its exponential (the linear model's noise sd, the negative binomial's
    dispersion); None when there is none."""
    if getattr(model, "samples_noise", False):
        return ("log_noise_sd", "noise_sd")
    return getattr(model, "extra_parameter", None)


def original_scale(draws, scaling):
    """Draws ``(chain, draw, d)`` of the standardised coefficients on the original scale of the features."""
    x = np.asarray(draws, np.float64)
    center = np.asarray(scaling["center"], np.float64)
    scale = np.asarray(scaling["scale"], np.float64)
    out = np.empty_like(x)
    if scaling["intercept"]:
        b = x[..., 1:]
        out[..., 1:] = b / scale
        out[..., 0] = x[..., 0] - np.sum(b * (center / scale), axis=-1)
    else:
        out[...] = x / scale
    return out


def original_scale_run(run, result, scaling, d, model):
    """``run`` with its draws (warmup included) on the original scale of the data: the coefficients as in
    :func:`original_scale` and the parameter of :func:`extra_parameter_of` (e.g. the noise sd, not its log)."""
    import dataclasses

    def conv(x):
        x = np.asarray(x)
        parts = [original_scale(x[..., :d], scaling)]
        if extra_parameter_of(model):
            parts.append(np.exp(np.asarray(x[..., d:d + 1], np.float64)))
        return np.concatenate(parts, axis=-1).astype(np.float64)

    res = dataclasses.replace(result, flat_samples=conv(result.flat_samples), flat_warmup=conv(result.flat_warmup),
                              _cache={})
    return dataclasses.replace(run, result=res)


def original_scale_laplace(mode, scaling, d, k):
    """The Laplace approximation's mean and sd on the original scale (the map to it is linear; NaN for the
    noise sd, whose Laplace curve is on the log scale)."""
    theta = np.asarray(mode.theta, np.float64)
    cov = np.asarray(mode.cov, np.float64)
    if theta.shape[0] != k or cov.shape != (k, k):
        return None
    A = original_scale(np.eye(d), scaling).T  # beta = A b: column j is the image of the unit vector e_j
    mean = np.full(k, np.nan)
    sd = np.full(k, np.nan)
    mean[:d] = A @ theta[:d]
    sd[:d] = np.sqrt(np.maximum(np.diag(A @ cov[:d, :d] @ A.T), 0.0))
    return mean, sd
