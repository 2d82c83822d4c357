"""Analysis of a sweep's results, never its compute: the Parquet tables read as Polars
frames (`distillab.analysis.results`), the figures (`distillab.analysis.plots`) and the
verdicts of PROTOCOL.md §9 (`distillab.analysis.findings`, over `rules`: the rules' text,
`cells`: the cells and their statistics, `verdicts`: one rule function per finding,
`confidence`: §9.1's redraws, and `findings_page`: the printed verdicts and findings.md).

Nothing here imports torch, the evaluations or the recipe (a test holds it to that), so a
notebook, ``distillab report`` and ``distillab findings`` start in about a second:

    >>> from distillab.analysis.results import load
"""
