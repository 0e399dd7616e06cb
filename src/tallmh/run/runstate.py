"""What the runner's stages hand each other: one :class:`Run` per call of :func:`tallmh.sample`.

In: the call's options (``Run(model, num_chains=..., seed=..., ...)``). Each stage module (``configure``,
``restore``, ``start``, ``programs``, ``selfaudit``, ``chunks``, ``finish``) reads and sets its attributes;
this module holds only the container and the two views of the draws every stage uses.
"""

from __future__ import annotations

from ..kernel import StepInfo


class Run:
    """One call of :func:`tallmh.sample`: its options, and what the stages make (data, kernel, states, draws,
    the self-audit's plan and its pending exact passes, timings, notes)."""

    def __init__(self, model, **kw):
        self.model = model
        self.__dict__.update(kw)
        self.notes: list = []
        self.timings = {"setup_s": 0.0, "compile_s": 0.0, "warmup_s": 0.0, "sampling_s": 0.0}
        self.collected = {"warmup": [], "sampling": []}
        self.done = {"warmup": 0, "sampling": 0}
        self.partial = False
        self.states = None
        self.start_info: dict = {}
        self.pilot_from = None  # the warmup steps before the proposal choice's MALA pilot, once one started
        self.chosen: dict = {}  # whether sample() chose the test and the proposal itself (configure.options)
        self.store = None
        self.plan = None
        self.stats = None
        self.stats_tap = None
        self.constrain = getattr(model, "constrain", None)
        self.empty_info = None
        self.audit_design = None  # the default audit's two-stage plan (selfaudit.audit_rates, .audit_clear)
        # the deferred audit's certificate (selfaudit.certificate: None until tried, False when none) and its count
        self.cert_state, self.cert_counted, self.audit_certified, self.kernel_oracle = None, False, 0, None
        self.cert_items = 0  # (the rows the certificate's pass read)
        self.audit_pending = []  # audited chain-steps waiting for their exact pass (selfaudit.take_audits, .flush_audits)
        self.audit_items_read, self.audit_budget = 0, None  # (the default audit's items, where counted as read)


def info_dict(info) -> dict:
    """A step's statistics as a dict (a kernel's :class:`StepInfo`, or a program's dict as it is)."""
    return info._asdict() if hasattr(info, "_asdict") else dict(info)


def empty_stats(run) -> dict:
    """The statistics of a step that was not made (their names and dtypes)."""
    return info_dict(run.empty_info(run.dtype) if run.empty_info is not None else StepInfo.empty(run.dtype))


def parts(run, pname):
    """The draws and statistics of phase ``pname`` so far: ``[(theta, info), ...]`` in memory, or one view of the
    files they were streamed to."""
    if run.store is None:
        return run.collected[pname]
    return [run.store.view(pname)] if run.store.counts[pname] else []
