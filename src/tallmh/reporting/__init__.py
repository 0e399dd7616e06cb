"""Reporting: what a run returns and shows.

``results`` (:class:`tallmh.Result`, the verdict, ArviZ output), ``diagnostics`` (R-hat, ESS, MCSE),
``report`` (the HTML report and its figures), ``compare`` (methods side by side against a reference).
Nothing is imported here.
"""
