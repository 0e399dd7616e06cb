"""hyper_coordinates with the prior's Hessian compiled as one program: which coordinates it counts."""

import jax.numpy as jnp
import numpy as np

from tallmh.linear_predictor import hyper_coordinates


def _eta(theta, batch):
    """Reads coordinates 0 and 1 (an intercept and a slope); 2 (a scale) and 3 (a free coefficient) unread."""
    return theta[0] + theta[1] * batch["x"]


def _prior(theta):
    """Coordinates 0 and 1 ~ N(0, exp(theta[2])): the scale couples to what the likelihood reads; 3 independent."""
    s = jnp.exp(theta[2])
    return -0.5 * (theta[0] ** 2 + theta[1] ** 2) / s**2 - 2 * theta[2] - 0.5 * theta[3] ** 2


def test_hyper_coordinates_counts_the_scale_only():
    data = {"x": np.linspace(-1, 1, 50).astype(np.float32)}
    theta = jnp.zeros(4, jnp.float32)
    assert hyper_coordinates(_eta, _prior, theta, data) == 1  # the scale; not the independent coefficient
    no_scale = lambda t: -0.5 * jnp.sum(t**2)  # noqa: E731 - every coordinate independent: none counted
    assert hyper_coordinates(_eta, no_scale, theta, data) == 0
