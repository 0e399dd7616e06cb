"""Where the time of a subsampled step goes: ns per data item for each part of reading a minibatch.

Logistic regression, N = 1e7, d = 10 + intercept, chunks of 4096 items: the keyed permutation
(Feistel + cycle-walking), the gather of the permuted rows, the two log-likelihood evaluations, all
together, and the same through tallmh's Problem.lik_ratio. Run: python benchmarks/profile_step.py [N]
"""
import sys
import time, jax, jax.numpy as jnp, numpy as np
from tallmh.storage.data import make_permutation, permute, take
import tallmh as tm
N=int(float(sys.argv[1])) if len(sys.argv) > 1 else 10**7
data,_=tm.models.LogisticRegression.simulate(N, d=10)
data=jax.tree_util.tree_map(jnp.asarray,data)
model=tm.models.LogisticRegression()
th=jnp.zeros(11); thp=th+0.01
perm=make_permutation(jax.random.PRNGKey(0))
m=4096
def bench(f,*a):
    f=jax.jit(f); r=f(*a); jax.block_until_ready(r)
    t=time.perf_counter()
    for i in range(200): r=f(*a)
    jax.block_until_ready(r); return (time.perf_counter()-t)/200/m*1e9
pos=jnp.arange(m)
print("permute ns/item", bench(lambda p: permute(perm,p,N), pos))
idx=permute(perm,pos,N)
print("gather ns/item", bench(lambda i: take(data,i)["X"].sum(), idx))
print("gather contiguous ns/item", bench(lambda i: take(data,i)["X"].sum(), pos))
b=take(data,idx)
print("loglik x2 ns/item", bench(lambda b: (model.log_lik(thp,b)-model.log_lik(th,b)).sum(), b))
print("all ns/item", bench(lambda p: (lambda b: (model.log_lik(thp,b)-model.log_lik(th,b)).sum())(take(data,permute(perm,p,N))), pos))
from jax.flatten_util import ravel_pytree
from tallmh.kernel import make_problem
_, un = ravel_pytree(th)
pr = make_problem(model, data, N, un, None, th, thp, jnp.zeros(()))
print("problem.lik_ratio ns/item", bench(lambda p: pr.lik_ratio(permute(perm,p,N)).sum(), pos))
