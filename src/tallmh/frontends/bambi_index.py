"""A Bambi model built from its formula and data frame without the rows x levels indicator matrix of its group terms.

``bmb.Model(formula, df)`` evaluates each group term's grouping factor with Bambi's formula library, which keeps it
as a dense float64 indicator matrix of rows x levels (800 MB at 10^6 rows x 100 levels, 80 GB at 10^7 x 1,000),
although the PyMC model Bambi builds reads the group effects through an integer index (the term's
``group_index``). :func:`indexed_bambi_model` builds the same model with each grouping column replaced by a
one-level column (a rows x 1 matrix), then gives each group term the real levels (formulae's labels, in formulae's
order) and the rows' integer codes before ``build()``. Nothing else in the model depends on the grouping column:
the response, the common terms, the priors (Bambi scales a group term's prior by the response and the term's
expression, not by its factor), the family, the link and the non-centred parameterisation are Bambi's own, so
the PyMC model is the one ``bmb.Model(formula, df).build()`` makes (tested: equal log densities).

Supported: grouping factors that are plain columns of the frame, used nowhere else in the formula (not as a common
term, in an interaction factor ``(1|g:h)`` or a call ``(1|C(g))``), without missing values, and no distributional
sub-formulas. Anything else raises :class:`~tallmh.errors.ConfigError` naming the cause (build ``bmb.Model``
yourself and pass it to :func:`tallmh.from_bambi` then).
"""

from __future__ import annotations

import numpy as np

from ..errors import ConfigError

__all__ = ["indexed_bambi_model"]


def _levels_and_codes(x):
    """formulae's levels of a categorical variable (``eval_categoric``: an ordered categorical's categories, otherwise
    the sorted distinct values) and each row's code among them."""
    import pandas as pd

    if isinstance(x.dtype, pd.CategoricalDtype) and x.dtype.ordered:
        cat = pd.Categorical(x)
        return cat.categories.tolist(), np.asarray(cat.codes)
    levels = sorted(pd.unique(np.asarray(x)).tolist())
    return levels, np.asarray(pd.Categorical(np.asarray(x), categories=levels).codes)


def _grouping_columns(formula, data):
    """``{column: [group term names]}`` of the formula's group terms, or ConfigError where one is not supported."""
    import formulae as fm
    from formulae.terms.variable import Variable

    if getattr(formula, "additionals", None):
        raise ConfigError("the formula-and-data route of from_bambi does not take distributional sub-formulas; "
                          "build bmb.Model yourself and pass it to tm.from_bambi")
    desc = fm.model_description(formula.main)
    columns = {}
    for t in desc.group_terms:
        comps = t.factor.components
        if len(comps) != 1 or not isinstance(comps[0], Variable) or comps[0].name not in data.columns:
            raise ConfigError(f"the group term {t.name} is grouped by {t.factor.name!r}, not by a column of the data "
                              "frame; the formula-and-data route of from_bambi takes plain grouping columns (build "
                              "bmb.Model yourself and pass it to tm.from_bambi)")
        columns.setdefault(comps[0].name, []).append(t.name)
    others = set(desc.response.term.var_names if desc.response is not None else ()) | \
        {v for t in desc.common_terms for v in t.var_names} | \
        {v for t in desc.group_terms for v in t.expr.var_names}
    for col in columns:
        if col in others:
            raise ConfigError(f"the grouping column {col!r} is also used outside the group terms' factors; the "
                              "formula-and-data route of from_bambi cannot take it (build bmb.Model yourself)")
        if data[col].isna().any():
            raise ConfigError(f"the grouping column {col!r} has missing values")
    return columns


def indexed_bambi_model(formula, data, **model_kwargs):
    """The built ``bambi.Model(formula, data, **model_kwargs)`` whose group terms' grouping factors were never held as
    rows x levels indicator matrices (see the module). Only for conversion: the returned model's formulae terms keep
    the one-level stand-ins, so Bambi's own prediction and plots must not be used on it."""
    import bambi as bmb
    import pandas as pd

    if not isinstance(data, pd.DataFrame):
        raise ConfigError(f"from_bambi(formula, data) needs a pandas DataFrame; got {type(data).__name__}")
    formula = formula if isinstance(formula, bmb.Formula) else bmb.Formula(formula)
    columns = _grouping_columns(formula, data)
    coded, stand_in = {}, {}
    for col in columns:
        levels, codes = _levels_and_codes(data[col])
        # formulae's labels of a grouping factor (Treatment coding with intercept: ``str`` of each level; its G x G
        # contrast matrix is not made here)
        coded[col] = ([str(level) for level in levels], codes.astype(np.intp))
        stand_in[col] = pd.Categorical.from_codes(np.zeros(len(data), np.int8), [levels[0]])
    bm = bmb.Model(formula, data.assign(**stand_in) if stand_in else data, **model_kwargs)
    rows = int(np.shape(bm.response_component.term.data)[0])
    if rows != len(data):
        raise ConfigError(f"Bambi kept {rows} of the frame's {len(data)} rows (missing values dropped): drop them from "
                          "the frame before from_bambi(formula, data)")
    seen = set()
    for comp in bm.components.values():
        for name, term in getattr(comp, "group_specific_terms", {}).items():
            col = term.term.factor.components[0].name
            labels, codes = coded[col]
            term.term.groups = list(labels)
            term.group_index = codes
            seen.add(name)
    want = {n for names in columns.values() for n in names}
    if not want <= seen:
        raise ConfigError(f"Bambi did not make the group terms {sorted(want - seen)} of the formula as expected; build "
                          "bmb.Model yourself and pass it to tm.from_bambi")
    bm.build()
    return bm
