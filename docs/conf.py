"""Sphinx configuration of the distillab docs site (Markdown pages through MyST).

Build (what tests/test_docs.py runs, warnings as errors, nitpicky references):

    sphinx-build -W --keep-going -n -b html docs docs/_build/html

The reference pages under reference/ are generated: ``python docs/generate.py``.
"""

project = "distillab"
author = "distillab developers"
copyright = "2026, distillab developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "figures/micro_rlvr"]  # figures/micro_rlvr: a report whose other panels are not kept
myst_heading_anchors = 3  # [text](page.md#a-heading) links, checked by the build
myst_enable_extensions = ["dollarmath", "deflist"]
nitpicky = True
# the findings pages are written by `distillab findings` and the figure summaries by
# `distillab report --plots`: their heading levels are theirs, not this site's
suppress_warnings = ["myst.header"]

html_theme = "furo"  # a maintained theme (pip: furo, in the docs extra): light and dark modes, a mobile layout
html_title = "distillab"
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # table cells: long code wraps (docs/_static/custom.css)
html_theme_options = {"navigation_with_keys": True}
