"""Memory during sampling grows with the draws kept, not with the number of chunks.

Each compiled chunk returns buffers of the chunk's full compiled length (up to 4,096 steps per chain); a
run whose chunks are short (a slow step, or the one-second chunks of a long run) uses a few steps of
each. Keeping a view of those steps would keep every buffer alive: on a model with a hundred parameters
that is megabytes per chunk, gigabytes over a ten-minute run.
"""

import jax
import numpy as np
import pytest

import tallmh as tm


@pytest.mark.filterwarnings("ignore::tallmh.TrustWarning")
def test_live_memory_does_not_grow_with_chunks():
    rng = np.random.default_rng(0)
    n, d = 2000, 64
    X = rng.normal(size=(n, d)).astype(np.float32) / 8
    y = (rng.random(n) < 0.5).astype(np.float32)
    data = {"X": X, "y": y}
    seen = []

    def cb(info):
        seen.append((info["phase"], sum(a.nbytes for a in jax.live_arrays())))

    r = tm.sample(tm.models.LogisticRegression(), data, test=tm.acceptance.Exact(),
                  proposal=tm.proposals.RandomWalk(scale=0.01), num_samples=300, num_warmup=100,
                  num_chains=4, chunk_size=None, chunk_seconds=1e-4, control_variates=False, init_jitter=0.0,
                  callback=cb, progress=False, seed=0, audit=False)
    assert r.samples.shape == (4, 300, d)
    chunks = len(seen)
    assert chunks >= 40, f"only {chunks} chunks: the test needs many short chunks"
    growth = seen[-1][1] - seen[1][1]
    draws = 4 * 400 * d * 4  # every draw of the run, once (a kept chunk buffer alone is 4 x 4,096 x d x 4 bytes)
    assert growth <= 4 * draws, (f"live device memory grew by {growth / 1e6:.1f} MB over {chunks} chunks (the draws "
                                 f"kept are {draws / 1e6:.2f} MB): chunk buffers are being kept alive")
