"""How a method is named in notes, summaries and fingerprints: the test with its options."""

from __future__ import annotations

import dataclasses

__all__ = ["method_label"]


def method_label(test, control_variates=None) -> str:
    """The method with its options, e.g. ``austerity(error=0.05, batch_size=500)+cv``."""
    own = getattr(test, "label", None)
    if isinstance(own, str):
        lab = own
    else:
        name = getattr(test, "name", type(test).__name__)
        opts = []
        if dataclasses.is_dataclass(test):
            for f in dataclasses.fields(test):
                v = getattr(test, f.name)
                if f.default is not dataclasses.MISSING and v == f.default:
                    continue
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    pass
                opts.append(f"{f.name}={v:g}" if isinstance(v, float) else f"{f.name}={v}")
        lab = f"{name}({', '.join(opts)})" if opts else name
    if control_variates is not None:
        lab += "+cv" if getattr(control_variates, "order", 2) == 2 else "+cv1"
    return lab
