"""Headroom for float rounding in the confidence test's range bounds.

The concentration bounds of :class:`~tallmh.acceptance.Confidence` need ``C >= max_i |l_i|`` for the
*computed* ``l_i = fl(log p(x_i|theta')) - fl(log p(x_i|theta))``, not only for their exact values: in
float32 each computed ``log p(x_i|theta)`` is off by a few ulps of the magnitudes it is made of, which
is far above the exact ``|l_i|`` when ``theta'`` is close to ``theta`` or when control variates cancel
almost everything (a quadratic log-likelihood with second-order control variates has exact remainders
0). Each built-in bound therefore adds ``ops * eps * M``, with ``M`` a bound on the size of the terms
that make up the ``l_i`` at theta and theta' (from the data statistics of ``setup``) and ``ops`` the
number of roundings they go through, and scales the analytic part by ``1 + 16 eps`` for its own rounding.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["rounding_headroom"]


def rounding_headroom(c, magnitude, ops: float = 8.0):
    """``c (1 + 16 eps) + ops eps magnitude`` in the dtype of ``c``."""
    c = jnp.asarray(c)
    eps = jnp.finfo(c.dtype).eps
    return c * (1.0 + 16.0 * eps) + ops * eps * jnp.asarray(magnitude, c.dtype)
