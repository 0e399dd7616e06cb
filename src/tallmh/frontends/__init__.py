"""Front ends: a user's program or table becomes a :class:`tallmh.Model` and its data.

``numpyro_model`` (NumPyro programs), ``pymc_model`` (PyMC and Bambi models), ``formula`` (formulas over a
table), ``design`` and ``design_cache`` (a table's standardised design, in memory or streamed into an on-disk
cache). Nothing is imported here: ``import tallmh`` stays free of JAX until something needs it.
"""
