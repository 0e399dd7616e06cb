"""Proposals (Langevin: ``propose_with_data``, which also gets a minibatch gradient function): ``init(theta, n) -> state``, ``propose(key, theta, state) -> (theta', log q ratio)``,
``update(state, theta, accepted, step) -> state`` (called during warmup only).

``log q ratio`` is ``log q(theta|theta') - log q(theta'|theta)``; parameters are flat vectors here (the
kernel ravels pytrees).
"""

from .adaptive import AdaptiveMetropolis
from .langevin import Langevin
from .laplace import CrankNicolson, SurrogateLangevin
from .laplace_choice import LaplaceChoice
from .random_walk import RandomWalk
from .rjmcmc import ReversibleJump
from .stiefel import StiefelWalk

__all__ = ["RandomWalk", "AdaptiveMetropolis", "Langevin", "StiefelWalk", "ReversibleJump", "CrankNicolson", "SurrogateLangevin",
           "LaplaceChoice"]
