"""Sphinx extension of the course's website: Going-deeper sections shown folded until the reader opens them.

docs/build_site.py labels each Going-deeper heading (a cell that JupyterLab opens folded) deeper-<notebook>-<n>;
here the body of each such section goes into an HTML <details> block under its heading.
"""

from __future__ import annotations

import re

from docutils import nodes


class going_deeper(nodes.General, nodes.Element):  # noqa: N801 (docutils names nodes in lower case)
    """The body of a Going-deeper section, shown folded (HTML <details>) until the reader opens it."""


def _visit_going_deeper(self, node):
    self.body.append('<details class="going-deeper"><summary>Show this section</summary>\n')


def _depart_going_deeper(self, node):
    self.body.append("</details>\n")


DEEPER = re.compile(r"deeper-.+-\d+$")


def collapse_going_deeper(app, doctree):
    """Fold each section labelled deeper-* by build_site.py (a heading JupyterLab opens folded)."""
    for section in list(doctree.findall(nodes.section)):
        if not any(DEEPER.match(name) for name in section["names"] + section["ids"]):
            continue
        title, body = section[0], section.children[1:]
        block = going_deeper()
        block.extend(body)
        section.children = [title, block]
        title.parent = block.parent = section


def setup(app):
    app.add_node(going_deeper, html=(_visit_going_deeper, _depart_going_deeper))
    app.connect("doctree-read", collapse_going_deeper)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
