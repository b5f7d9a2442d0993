"""Sphinx configuration of the course's website; `make site` runs docs/build_site.py, which lays out the sources."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "notebooks"))
import nbtools  # noqa: E402

project = "Attention, Step by Step"
author = "the course's authors"
copyright = "the course's authors"  # noqa: A001 (Sphinx's name)
root_doc = "index"

sys.path.insert(0, str(ROOT / "docs"))
extensions = [
    "myst_nb",  # reads the notebooks and Markdown pages
    "course_site",  # docs/course_site.py: the Going-deeper sections, folded
    "sphinx-mathjax-offline",  # MathJax served from the site itself: no CDN needed to typeset equations
]
# The notebooks are shown as stored: never executed here.
nb_execution_mode = "off"
nb_merge_streams = True
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3
# _course_map.md is included by the home page; _ipynb/ holds the notebooks offered for download.
exclude_patterns = ["_course_map.md", "_ipynb/**", "**/.ipynb_checkpoints"]

html_theme = "furo"  # search, previous/next links, and a layout that reflows at a phone's width
html_title = project
html_static_path = [str(ROOT / "docs" / "_static")]
html_css_files = ["course.css"]
html_favicon = str(ROOT / "docs" / "_static" / "favicon.svg")
html_show_sourcelink = False
html_copy_source = False

_repository = nbtools.course_config()["repository"]
if nbtools.PLACEHOLDER_ACCOUNT not in _repository:
    html_theme_options = {"source_repository": _repository}
