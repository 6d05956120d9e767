"""Sphinx configuration of the course book (``make book``; labkit/book.py prepares
the sources: these pages, the README and INSTRUCTORS.md, and the solution notebooks
with a header cell each)."""

import os

project = "Multi-GPU training with PyTorch"
author = "the course's authors"
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "README.md", "INSTRUCTORS.md"]
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {"show_toc_level": 2, "use_download_button": True}
html_static_path = []
html_last_updated_fmt = "%Y-%m-%d"

# Execution: every notebook runs once per mode and is cached (jupyter-cache), so only
# changed notebooks run again. labkit/book.py points the cache at one folder per mode
# (quick and full outputs differ, their code does not).
nb_execution_mode = "cache"
nb_execution_cache_path = os.environ["LABKIT_BOOK_CACHE"]
nb_execution_timeout = 3600
nb_execution_in_temp = True          # %%writefile modules land in a temporary folder
nb_execution_raise_on_error = True   # a notebook that fails fails the build
nb_execution_show_tb = True
nb_merge_streams = True
# Widgets need a live kernel: the book renders their static fallback (labkit draws
# one picture and says so when LABKIT_STATIC=1), never "Error displaying widget".
nb_ipywidgets_js = {}
nb_mime_priority_overrides = [("html", "application/vnd.jupyter.widget-view+json", None),
                              ("html", "application/vnd.jupyter.widget-state+json", None)]
