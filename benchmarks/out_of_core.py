"""Out-of-core data: sampling from ``.npy`` files that stay on disk, against the same data in memory.

Bayesian logistic regression (``tm.models.LogisticRegression(prior_scale=10)``), 10 standard-normal
features plus an intercept column, float32, ``y ~ Bernoulli(sigmoid(x . theta))`` with ``theta ~ N(0, I/10)``
(seed 0). The data is written to ``X.npy`` (N x 11) and ``y.npy`` (N) in blocks of 2^20 rows through
``np.lib.format.open_memmap``, so it is never whole in memory (N = 10^9 is 44 GB; a disk with ~50 GB free
and any RAM will do). ``--data-dir`` keeps the files for later runs (they are reused when their
``meta.json`` matches N and the seed); without it they go to a temporary folder, removed at the end unless
``--keep-files``.

For each N, two runs, each in its own process (so that peak memory is measured apart):

- ``disk``: ``data = tm.data.from_npy({"X": ..., "y": ...})`` (files of up to 2^23 rows are checked for NaN
  and inf when opened: ``open_s``; larger ones by the call's first set-up pass, in ``setup_s``) then the
  README's call, austerity with control variates::

      tm.sample(model, data, test=tm.acceptance.Austerity(error=0.05, batch_size=100),  # --batch
                control_variates=tm.ControlVariates(order=2), num_samples=..., num_warmup=...,
                num_chains=2, seed=0)

  With ``--test default`` the call is ``tm.sample(model, data, num_samples=..., num_warmup=..., num_chains=...,
  seed=0)``: the default, for this model the exact subsampled test, whose item table is one more pass over the
  files (timed apart: ``table_s``, inside ``setup_s``), or, where the set-up's last Newton pass made the table's
  weights, that pass (``fused_pass_s``) and the table's grouping after it (``fused_finish_s``), both inside
  ``setup_s``. ``first_pass_at_s``: seconds from opening the files to the set-up's first full pass;
  ``bulk_table``: where the large-N sampler made the table (``factor_bounds.BulkBuilder``), its level ``tau``, heavy
  items and ``rate_ratio`` (its total rate over the weights' sum: the extra rows a step reads, in proportion).

- ``memory``: the same call on ``np.load`` of the same files (skipped when the data is more than
  ``--memory-fraction`` of the available RAM).

Reported per run: set-up time (Newton passes, control-variate sums, model set-up: ``setup_s``; plus
``open_s`` for the disk run), compile time, time per step (``sampling_s`` / draws; a step advances all
chains), items read per step, min bulk ESS, ESS/s of the sampling phase and of the whole call, set-up
passes (``setup_items / N``), the peak anonymous (non-file) resident memory sampled every 0.1 s, and
whether the run is trusted. The disk run's files are in the page cache when they fit in RAM (they were
just written), so at N <= 10^8 on this machine it measures the page cache, not the disk; ``--cold-read``
also measures the disk's own sequential and random read speed with ``O_DIRECT`` (bypassing the cache),
from which an N = 10^9 run, whose 44 GB do not fit in RAM, can be estimated (``estimate_1e9`` in the
JSON; see the README text).

Usage::

    python benchmarks/out_of_core.py --n 1e6 1e7                 # writes benchmarks/results/out_of_core.json
    python benchmarks/out_of_core.py --n 1e9 --data-dir DIR --keep-files --no-memory --audit 0
    python benchmarks/out_of_core.py --smoke --out /tmp/ooc.json # seconds: N = 2e4, few steps
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

import _common as C

D_FEATURES = 10
BLOCK = 2**20


def _meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])  # kB
    return 0


def true_theta(seed=0):
    rng = np.random.default_rng([seed, 2**31])
    return rng.standard_normal(D_FEATURES + 1) / np.sqrt(D_FEATURES)


def write_data(folder, n, seed=0, progress=True):
    """Write X.npy (n x 11, float32, first column ones) and y.npy in blocks; reuse files that match."""
    os.makedirs(folder, exist_ok=True)
    meta_path = os.path.join(folder, "meta.json")
    want = {"n": int(n), "d": D_FEATURES + 1, "seed": int(seed), "dtype": "float32", "complete": True}
    if os.path.exists(meta_path):
        with open(meta_path) as f:
            if json.load(f) == want:
                return 0.0, True
    t0 = time.perf_counter()
    if os.path.exists(meta_path):
        os.remove(meta_path)
    theta = true_theta(seed)
    X = np.lib.format.open_memmap(os.path.join(folder, "X.npy"), mode="w+", dtype=np.float32,
                                  shape=(n, D_FEATURES + 1))
    y = np.lib.format.open_memmap(os.path.join(folder, "y.npy"), mode="w+", dtype=np.float32, shape=(n,))
    bar = None
    if progress and n >= 8 * BLOCK:
        from tqdm.auto import tqdm

        bar = tqdm(total=n, unit="row", unit_scale=True, desc="writing data", file=sys.stderr, mininterval=2.0)
    for b, s in enumerate(range(0, n, BLOCK)):
        m = min(BLOCK, n - s)
        rng = np.random.default_rng([seed, b])
        xb = np.empty((m, D_FEATURES + 1), np.float32)
        xb[:, 0] = 1.0
        xb[:, 1:] = rng.standard_normal((m, D_FEATURES), dtype=np.float32)
        p = 1.0 / (1.0 + np.exp(-(xb.astype(np.float64) @ theta)))
        X[s:s + m] = xb
        y[s:s + m] = (rng.random(m) < p).astype(np.float32)
        if b % 64 == 63:  # write back dirty pages as we go, so they never pile up in RAM
            X.flush()
            y.flush()
        if bar is not None:
            bar.update(m)
    X.flush()
    y.flush()
    del X, y
    if bar is not None:
        bar.close()
    with open(meta_path, "w") as f:
        json.dump(want, f)
    return time.perf_counter() - t0, False


class _PeakAnon:
    """Peak of RssAnon (resident memory not backed by a file: page-cache pages of the data do not count)."""

    def __init__(self):
        self.peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _now(self):
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
        return 0

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self._now())
            time.sleep(0.1)

    def stop(self):
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, self._now())
        return self.peak


def evict(folder):
    """Drop the data files' pages from the page cache (theirs only: ``posix_fadvise(DONTNEED)``)."""
    for name in ("X.npy", "y.npy"):
        fd = os.open(os.path.join(folder, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def run_one(mode, folder, args):
    """One timed call (in this process): mode "disk" or "memory"; returns a dict of numbers."""
    import warnings

    import tallmh as tm
    from tallmh.storage import datasource

    if args.progress:
        datasource.PROGRESS = True
    mon = _PeakAnon()
    paths = {"X": os.path.join(folder, "X.npy"), "y": os.path.join(folder, "y.npy")}
    t0 = time.perf_counter()
    if mode == "disk":
        data = tm.data.from_npy(paths, gather=args.gather, check_finite=False if args.no_check else "auto")
        kinds = datasource.describe(data)
    else:
        data = {k: np.load(p) for k, p in paths.items()}
        kinds = {"X": "memory", "y": "memory"}
    open_s = time.perf_counter() - t0
    model = tm.models.LogisticRegression(prior_scale=10.0)
    from tallmh import factor_bounds

    table = {"s": 0.0}
    prepare = factor_bounds.prepare

    def timed_prepare(*a, **k):  # the exact test's table pass, timed apart (inside setup_s)
        t = time.perf_counter()
        try:
            return prepare(*a, **k)
        finally:
            table["s"] += time.perf_counter() - t

    factor_bounds.prepare = timed_prepare
    fused = {"pass_s": 0.0, "finish_s": 0.0, "used": False}
    try:  # the table's weights made in the set-up's last Newton pass: that pass and the table's grouping, timed
        from tallmh import fused_table
    except ImportError:  # (an earlier version, measured for comparison)
        fused_table = None
    if fused_table is not None:
        run0, table0 = fused_table.FusedTable.run, fused_table.FusedTable.table

        def timed(fn, key):
            def wrapper(*a, **k):
                t = time.perf_counter()
                try:
                    out = fn(*a, **k)
                    if key == "finish_s" and out is not None:
                        fused["used"] = True
                    return out
                finally:
                    fused[key] += time.perf_counter() - t
            return wrapper

        fused_table.FusedTable.run = timed(run0, "pass_s")
        fused_table.FusedTable.table = timed(table0, "finish_s")
    from tallmh import setup_passes

    first_pass, full_pass = {"at_s": None}, setup_passes.full_pass

    def timed_full_pass(*a, **k):  # the time from opening the files to the set-up's first full pass
        if first_pass["at_s"] is None:
            first_pass["at_s"] = time.perf_counter() - t0
        yield from full_pass(*a, **k)

    setup_passes.full_pass = timed_full_pass
    bulk = {}
    try:  # the large-N sampler (no array of N): its level, heavy items and the rate's ratio to the weights' sum
        from tallmh.factor_bounds import BulkBuilder
    except ImportError:  # (an earlier version)
        BulkBuilder = None
    if BulkBuilder is not None:
        bulk_table = BulkBuilder.table

        def spied(self, *a, **k):
            out = bulk_table(self, *a, **k)
            bulk.update(tau=self.tau, heavy=self.heavy, heavy_max=self.k, rate_ratio=self.rate_ratio)
            return out

        BulkBuilder.table = spied
    try:  # the one-pass set-up's rule (tallmh.one_pass), forced with --one-pass
        from tallmh import one_pass
        one_pass.MODE = args.one_pass
    except ImportError:  # (an earlier version, measured for comparison)
        pass
    if args.compiled_weights:  # the exact table's weights in the compiled pass (the form before the NumPy ones)
        from tallmh import fused_table
        fused_table.HOST_WEIGHTS = False
    how = {} if args.test == "default" else dict(
        test=tm.acceptance.Austerity(error=0.05, batch_size=args.batch), control_variates=tm.ControlVariates(order=2),
        proposal=tm.proposals.Langevin() if args.proposal == "langevin" else tm.proposals.AdaptiveMetropolis())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = tm.sample(model, data, num_samples=args.samples, num_warmup=args.warmup, num_chains=args.chains,
                        seed=0, audit=args.audit, progress=args.progress, **how)
    wall = time.perf_counter() - t0
    peak = mon.stop()
    o = res.summary().overall
    n = res.n
    draws = res.num_draws
    theta = true_theta(0)
    post_mean = res.flat_samples.reshape(-1, res.flat_samples.shape[-1]).mean(axis=0)
    out = {
        "mode": mode, "N": n, "gather": kinds, "chains": args.chains, "draws": draws, "warmup": args.warmup,
        "method": res.label, "open_s": open_s, "setup_s": res.timings["setup_s"], "table_s": table["s"],
        "fused_pass_s": fused["pass_s"], "fused_finish_s": fused["finish_s"], "fused_table_used": fused["used"],
        "first_pass_at_s": first_pass["at_s"], "bulk_table": bulk or None, "compile_s": res.timings["compile_s"],
        "warmup_s": res.timings["warmup_s"], "sampling_s": res.timings["sampling_s"],
        "call_s": res.timings["total_s"], "wall_s": wall,
        "time_per_step_us": 1e6 * res.timings["sampling_s"] / max(1, draws),
        "items_per_step": o["mean_n_data"], "acceptance": o["acceptance_rate"],
        "ess_min": o["ess_min"], "ess_per_s": o["ess_per_s"], "ess_per_s_whole_call": o["ess_min"] / wall,
        "rhat_max": o["rhat_max"], "setup_passes": res.setup_items / n, "audit_steps": o.get("audit_steps"),
        "audit_wrong": o.get("audit_wrong"), "audit_items": o.get("audit_items"),
        "peak_anon_gb": peak / 1e9, "data_gb": (n * (D_FEATURES + 2) * 4) / 1e9,
        "max_abs_mean_minus_true_theta": float(np.max(np.abs(post_mean - theta))),
        "trusted": bool(res.trusted), "verdict": res.verdict,
        "warnings": sorted({str(w.message)[:200] for w in caught}),
        "setup_notes": [m for m in res.notes if "full pass" in m or "Newton pass" in m],
    }
    return out


def cold_read(folder, seconds=10.0):
    """Sequential and random 4 KiB read speed of the disk with O_DIRECT (page cache bypassed)."""
    import mmap

    path = os.path.join(folder, "X.npy")
    size = os.path.getsize(path)
    out = {}
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:  # pragma: no cover - a filesystem without O_DIRECT
        return {"error": str(e)}
    try:
        buf = mmap.mmap(-1, 16 * 2**20)
        t0, done, off = time.perf_counter(), 0, 0
        while time.perf_counter() - t0 < seconds / 2 and off < size:
            got = os.preadv(fd, [buf], off)
            if got <= 0:
                break
            done += got
            off += got
        out["sequential_mb_s"] = done / 2**20 / (time.perf_counter() - t0)
        out["sequential_bytes"] = done
        small = mmap.mmap(-1, 4096)
        rng = np.random.default_rng(0)
        pages = size // 4096
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds / 2:
            os.preadv(fd, [small], int(rng.integers(0, pages)) * 4096)
            k += 1
        out["random_4k_reads_per_s"] = k / (time.perf_counter() - t0)
        out["random_4k_latency_us"] = 1e6 / out["random_4k_reads_per_s"]
    finally:
        os.close(fd)
    return out


def estimate(rows, cold, n_target=10**9, mem_gb=None):
    """Rough time of an N = n_target disk run from measured runs (see the module docstring)."""
    disk = [r for r in rows if r["mode"] == "disk"]
    if not disk:
        return None
    r = max(disk, key=lambda r: r["N"])
    scale = n_target / r["N"]
    data_gb = n_target * (D_FEATURES + 2) * 4 / 1e9
    est = {"from_N": r["N"], "data_gb": data_gb,
           # + from_npy's finiteness check where it was a pass of its own (files up to 2^23 rows)
           "setup_passes": r["setup_passes"] + (1 if r["N"] <= 2**23 else 0),
           "setup_s_if_cpu_bound": (r["setup_s"] + r["open_s"]) * scale}
    if cold and cold.get("sequential_mb_s", 0) > 0 and cold.get("sequential_bytes", 0) >= 2**28:
        est["one_pass_disk_s"] = data_gb * 1e9 / 2**20 / cold["sequential_mb_s"]
        est["setup_s_if_disk_bound"] = est["setup_passes"] * est["one_pass_disk_s"]
        # each item a step reads is one random row: a page fault when not cached (RAM / data of it cached)
        mem = mem_gb if mem_gb else _meminfo("MemTotal") / 2**20
        hit = min(1.0, 0.8 * mem / data_gb)
        est["cache_hit_fraction_guess"] = hit
        est["time_per_step_us_disk"] = r["time_per_step_us"] + r["items_per_step"] * r["chains"] * (1 - hit) * \
            cold["random_4k_latency_us"]
    return est


def main(argv=None):
    argv = sys.argv if argv is None else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=float, nargs="+", default=[1e6, 1e7])
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--warmup", type=int, default=500)
    p.add_argument("--chains", type=int, default=2)
    p.add_argument("--audit", type=float, default=None,
                   help="self-audit rate (default: tallmh's, ~40 exact full passes in warmup; 0 for N >= 1e9)")
    p.add_argument("--test", default="austerity", choices=["austerity", "default"],
                   help="austerity with control variates and --proposal (the earlier runs), or tm.sample's default "
                        "(no test, control variates or proposal given: the exact subsampled test for this model)")
    p.add_argument("--batch", type=int, default=100, help="the austerity test's batch size")
    p.add_argument("--proposal", default="am", choices=["am", "langevin"],
                   help="tm.proposals.AdaptiveMetropolis() (the earlier runs) or tm.proposals.Langevin() "
                        "(preconditioned MALA: tm.sample's default with control variates)")
    p.add_argument("--gather", default="auto", choices=["auto", "zero_copy", "callback"])
    p.add_argument("--data-dir", default=None, help="folder for the .npy files (one sub-folder per N); reused")
    p.add_argument("--keep-files", action="store_true", help="keep the files (default when --data-dir is given)")
    p.add_argument("--no-memory", action="store_true", help="skip the in-memory run")
    p.add_argument("--memory-fraction", type=float, default=0.4,
                   help="run in memory only when the data is below this fraction of MemAvailable")
    p.add_argument("--no-check", action="store_true", help="from_npy(check_finite=False)")
    p.add_argument("--evict", action="store_true",
                   help="drop the data files' own pages from the page cache before each run (posix_fadvise "
                        "DONTNEED on the two files only: the passes then read the disk)")
    p.add_argument("--cold-read", action="store_true", help="measure the disk's O_DIRECT read speed")
    p.add_argument("--one-pass", default="auto", choices=["auto", "always", "never"],
                   help="the exact default's one-pass set-up: its rule (auto) or forced (tallmh.one_pass.MODE)")
    p.add_argument("--progress", action="store_true", help="progress bars (set-up passes, sampling)")
    p.add_argument("--compiled-weights", action="store_true",
                   help="the exact table's weights in the set-up's compiled pass, fused with the derivatives, "
                        "instead of in NumPy beside it (tallmh.fused_table.HOST_WEIGHTS = False)")
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--out", default=os.path.join(C.RESULTS, "out_of_core.json"))
    p.add_argument("--_child", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args(argv[1:])
    if args._child:
        print("RESULT " + json.dumps(run_one(args._child[0], args._child[1], args)))
        return
    if args.smoke:
        args.n, args.samples, args.warmup = [2e4], 100, 100
    meta = C.machine_info(argv, mem_total_gb=_meminfo("MemTotal") / 2**20)
    base = args.data_dir or tempfile.mkdtemp(prefix="tallmh_ooc_")
    if args.data_dir and os.path.exists(os.path.join(base, "meta.json")):  # (an N<n> folder given: its N<n> inside
        # would be written anew, tens of GB at 1e9)
        sys.exit(f"--data-dir {base} holds data files itself: give the folder that holds its N<n> folders")
    keep = args.keep_files or args.data_dir is not None
    rows, writes, cold = [], [], None
    try:
        for nf in args.n:
            n = int(nf)
            folder = os.path.join(base, f"N{n}")
            ws, reused = write_data(folder, n, progress=True)
            writes.append({"N": n, "write_s": ws, "reused": reused, "folder": folder})
            print(f"N = {n:.0e}: data {'reused' if reused else f'written in {ws:.1f} s'} ({folder})", flush=True)
            modes = ["disk"]
            data_bytes = n * (D_FEATURES + 2) * 4
            if not args.no_memory and data_bytes < args.memory_fraction * _meminfo("MemAvailable") * 1024:
                modes.append("memory")
            for mode in modes:
                if args.evict:
                    evict(folder)
                cmd = [sys.executable, os.path.abspath(argv[0]), "--_child", mode, folder, "--samples",
                       str(args.samples), "--warmup", str(args.warmup), "--chains", str(args.chains),
                       "--batch", str(args.batch), "--proposal", args.proposal, "--test", args.test,
                       "--gather", args.gather, "--one-pass", args.one_pass] + \
                    (["--audit", str(args.audit)] if args.audit is not None else []) + \
                    (["--no-check"] if args.no_check else []) + (["--progress"] if args.progress else []) + \
                    (["--compiled-weights"] if args.compiled_weights else [])
                proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if proc.returncode != 0 or not line:
                    print(f"  {mode}: failed (exit {proc.returncode})", flush=True)
                    rows.append({"mode": mode, "N": n, "error": proc.returncode})
                    continue
                r = json.loads(line[-1][7:])
                rows.append(r)
                print(f"  {mode:6s} [{'/'.join(sorted(set(r['gather'].values())))}] {r['method']}: open {r['open_s']:.1f} s, "
                      f"set-up {r['setup_s']:.1f} s ({r['setup_passes']:.2f} passes; table {r['table_s']:.1f} s; fused pass "
                      f"{r.get('fused_pass_s', 0):.1f} s, its table {r.get('fused_finish_s', 0):.1f} s), "
                      f"compile {r['compile_s']:.1f} s, warmup {r['warmup_s']:.1f} s, sampling {r['sampling_s']:.1f} s, "
                      f"call {r['call_s']:.1f} s, "
                      f"{r['time_per_step_us']:.0f} us/step, {r['items_per_step']:.0f} items/step/chain, "
                      f"ESS {r['ess_min']:.0f}, ESS/s {r['ess_per_s']:.0f} (whole call {r['ess_per_s_whole_call']:.1f}), "
                      f"peak anon {r['peak_anon_gb']:.2f} GB (data {r['data_gb']:.2f} GB), {r['verdict'][:60]}",
                      flush=True)
        if args.cold_read:
            cold = cold_read(os.path.join(base, f"N{int(max(args.n))}"))
            print(f"disk, O_DIRECT: {cold}", flush=True)
    finally:
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
    est = estimate([r for r in rows if "error" not in r], cold)
    if est:
        print(f"estimate for N = 1e9 from N = {est['from_N']:.0e}: {json.dumps(est)}", flush=True)
    out = {"meta": meta, "config": {"samples": args.samples, "warmup": args.warmup, "chains": args.chains,
                              "proposal": args.proposal, "batch": args.batch,
                                           "audit": args.audit, "gather": args.gather, "evict": args.evict,
                                           "compiled_weights": args.compiled_weights, "test": "default" if args.test == "default" else f"Austerity(0.05, {args.batch})",
                                           "control_variates": "ControlVariates(order=2)", "d": D_FEATURES + 1},
           "writes": [{k: v for k, v in w.items() if k != "folder"} for w in writes], "runs": rows,
           "disk_cold_read": cold, "estimate_1e9": est}
    C.write_json(os.path.dirname(os.path.abspath(args.out)), os.path.basename(args.out), out)


if __name__ == "__main__":
    main()
