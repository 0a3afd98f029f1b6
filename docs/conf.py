"""Sphinx configuration of the sb3_ppo_ext documentation site.

Build: ``pip install ".[docs]"`` then ``sphinx-build -W -b html docs docs/_build/html`` (CI builds
it with warnings as errors, ``tests/test_docs_build.py``). Pages are Markdown (myst-parser); the API
reference is generated from the docstrings: autosummary walks every module of ``sb3_ppo_ext``
(new modules appear without editing this site) and autodoc renders each one.
"""

from __future__ import annotations

import os
import sys

# Document the package of this checkout, installed or not.
sys.path.insert(0, os.path.abspath(".."))

import sb3_ppo_ext  # noqa: E402

project = "sb3_ppo_ext"
author = "sb3_ppo_ext contributors"
copyright = "sb3_ppo_ext contributors"
version = release = sb3_ppo_ext.__version__

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.intersphinx",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
# docs/benchmarks/ holds the report's data, figures and notes, not pages (the figures are still
# copied: BENCHMARKS.md shows them).
exclude_patterns = ["_build", "benchmarks", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

autosummary_generate = True
autosummary_imported_members = False
# Each object on the page of the module that defines it, once: a module's __all__ re-exports (the
# package's PPOExt, the callbacks' ParameterSchedule) are not documented again where they are
# re-exported, which also keeps viewcode's "[docs]" links pointing at the one documented object.
autodoc_default_options = {"members": True, "show-inheritance": True, "ignore-module-all": True}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_class_signature = "mixed"
# The docstrings are SB3's reST flavour; their type hints name SB3 / torch / gymnasium types that
# intersphinx cannot always resolve without network access: keep unresolved hints as plain text.
nitpicky = False

intersphinx_mapping: dict[str, tuple[str, str | None]] = {}

html_theme = "furo"
html_title = f"sb3_ppo_ext {release}"
