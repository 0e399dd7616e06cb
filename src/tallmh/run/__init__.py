"""The runner: :func:`tallmh.sample` as a list of stages (see ``docs/architecture.md``).

Nothing is imported here: ``import tallmh`` stays free of JAX until something needs it.
"""
