"""How long and how much memory ending a long ``tallmh run`` takes: a run of many draws stopped with Ctrl-C,
then its outputs written (summary, posterior.nc, results.json, report.html).

A 1-chain linear regression on a 300-row table samples until its draws file holds ``--draws`` draws, is sent
SIGINT, and is timed from the signal to its exit; the peak resident memory of the process (sampling
included) is read from the kernel (``ru_maxrss`` of the child), and from the signal on its memory is polled
every 0.1 s: ``VmRSS`` and ``RssAnon`` (the process's own memory; the rest of its RSS is pages of the
memory-mapped draws files, which the kernel can drop). ``--folder DIR`` instead times the end of the
stopped run saved in DIR (``tallmh run --resume DIR --samples <its draws>`` writes its outputs). Prints one
line and saves it under benchmarks/results/.

    PYTHONPATH=src python benchmarks/long_run_end.py --draws 10000000
    PYTHONPATH=src python benchmarks/long_run_end.py --folder /tmp/x/run      # (a copy: the outputs are rewritten)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np


def _poll(proc):
    """Peak VmRSS and RssAnon (MB) of ``proc`` until it ends."""
    peak = {"VmRSS": 0, "RssAnon": 0}
    while proc.poll() is None:
        try:
            with open(f"/proc/{proc.pid}/status") as f:
                for line in f:
                    key = line.split(":")[0]
                    if key in peak:
                        peak[key] = max(peak[key], int(line.split()[1]) // 1024)
        except OSError:
            pass
        time.sleep(0.1)
    return peak


def _save(line):
    print(json.dumps(line))
    os.makedirs(os.path.join(os.path.dirname(__file__), "results"), exist_ok=True)
    with open(os.path.join(os.path.dirname(__file__), "results", "long_run_end.jsonl"), "a") as f:
        f.write(json.dumps(line) + "\n")


def end_of_saved(folder):
    import tallmh as tm

    k = tm.load_result(os.path.join(folder, "checkpoint.npz")).flat_samples.shape[1]
    for f in ("posterior.nc", "results.json", "report.html"):
        if os.path.exists(os.path.join(folder, f)):
            os.remove(os.path.join(folder, f))
    t1 = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "tallmh", "run", "--resume", folder, "--samples", str(k),
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = _poll(proc)
    err = proc.communicate()[1]
    _save({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "mode": "outputs of a saved run",
           "draws_per_chain": int(k), "ending_s": round(time.time() - t1, 1), "peak_vmrss_mb": peak["VmRSS"],
           "peak_rss_anon_mb": peak["RssAnon"], "status": proc.returncode,
           "load": open("/proc/loadavg").read().split()[:3]})
    if proc.returncode != 0:
        print(err[-2000:], file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--draws", type=int, default=10_000_000)
    ap.add_argument("--folder", default=None)
    a = ap.parse_args()
    if a.folder:
        return end_of_saved(a.folder)
    root = tempfile.mkdtemp(prefix="tallmh-long-end-")
    rng = np.random.default_rng(3)
    n = 300
    X = rng.normal(size=(n, 2))
    y = 1.0 + X @ np.array([0.5, -0.3]) + rng.normal(size=n)
    table = os.path.join(root, "t.csv")
    np.savetxt(table, np.column_stack([X, y]), delimiter=",", header="a,b,y", comments="")
    out = os.path.join(root, "run")
    cmd = [sys.executable, "-m", "tallmh", "run", table, "--target", "y", "--model", "linear", "--noise-sd", "1",
           "--samples", str(10**9), "--warmup", "0", "--chains", "1", "--quiet", "--out", out]
    t0 = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    theta = os.path.join(out, "checkpoint.npz.draws", "sampling.theta.bin")
    need = a.draws * 3 * 4  # 1 chain, d = 3, float32
    while not (os.path.exists(theta) and os.path.getsize(theta) >= need):
        if proc.poll() is not None:
            raise SystemExit(proc.stderr.read())
        time.sleep(0.2)
    t_sampled = time.time() - t0
    t1 = time.time()
    proc.send_signal(signal.SIGINT)
    end_peak = _poll(proc)
    err = proc.communicate()[1]
    t_end = time.time() - t1
    peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    import arviz as az

    k = az.from_netcdf(os.path.join(out, "posterior.nc")).posterior.sizes["draw"]
    line = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "posterior_nc_draws_per_chain": int(k),
            "sampling_s": round(t_sampled, 1), "ending_s": round(t_end, 1), "peak_rss_mb": round(peak_mb),
            "ending_peak_vmrss_mb": end_peak["VmRSS"], "ending_peak_rss_anon_mb": end_peak["RssAnon"],
            "posterior_nc_mb": round(os.path.getsize(os.path.join(out, "posterior.nc")) / 1e6, 1),
            "status": proc.returncode, "load": open("/proc/loadavg").read().split()[:3]}
    _save(line)
    if proc.returncode != 130:
        print(err[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
