"""Sphinx configuration of the course book (``make book``; coursetools/book.py prepares
the sources: these pages, INSTRUCTORS.md, and the solution notebooks with a header
cell each). One configuration for both editions: coursetools/book.py sets
LABKIT_BOOK_LANG to "en" (the site's root) or "zh_CN" (the zh_CN/ folder beside it)."""

import os

LANG = os.environ.get("LABKIT_BOOK_LANG", "en")
project = {"en": "Multi-GPU training with PyTorch",
           "zh_CN": "用 PyTorch 进行多 GPU 训练"}[LANG]
language = LANG   # for zh_CN, Sphinx's search splits Chinese words with jieba
author = "the course's authors"
extensions = ["myst_nb"]
exclude_patterns = ["_build", "**.ipynb_checkpoints", "INSTRUCTORS.md",
                    "INSTRUCTORS.*.md"]   # included by instructors.md, not pages
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]

html_theme = "sphinx_book_theme"
html_title = project
html_theme_options = {"show_toc_level": 2, "use_download_button": True}
html_static_path = []
html_last_updated_fmt = "%Y-%m-%d"

# Execution: every notebook runs once per mode and is cached (jupyter-cache), so only
# changed notebooks run again. coursetools/book.py points the cache at one folder per mode
# (quick and full outputs differ, their code does not).
nb_execution_mode = "cache"
if os.environ.get("LABKIT_BOOK_PREVIEW"):   # an author's look at the pages: no outputs
    nb_execution_mode = "off"
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


# The language switch: a link at the top of every page to the same page in the other
# edition (the Chinese one lives in zh_CN/ under the English site). The Chinese edition
# has the labs, the primers, its index and setup; its other pages link to the English ones.
SWITCH = {"en": ("zh_CN/", "中文"), "zh_CN": ("../", "English")}
IN_BOTH = ("index", "setup", "search", "genindex")


def _language_switch(app, pagename, templatename, context, doctree):
    prefix, label = SWITCH[LANG]
    shared = (LANG != "en" or pagename in IN_BOTH
              or pagename.startswith(("labs/", "primers/")))
    target = pagename if shared else "index"
    up = "../" * pagename.count("/")
    context["body"] = (f'<p class="labkit-language-switch"><a href="{up}{prefix}{target}.html" '
                       f'hreflang="{"zh" if LANG == "en" else "en"}">{label}</a></p>\n'
                       + context.get("body", ""))


def setup(app):
    app.connect("html-page-context", _language_switch)
    if LANG == "zh_CN":
        app.add_search_language(_chinese_search())


def _chinese_search():
    """Sphinx's Chinese search, with its stemmer's JavaScript name fixed.

    Sphinx 9.0.4 writes ``window.Stemmer = ChineseStemmer;`` into language_data.js, but
    the stemmer it ships for Chinese is the English one, so the search page stops with
    "ChineseStemmer is not defined" and finds nothing (sphinx-doc/sphinx#14229, fixed by
    #14416 after 9.0.4). Naming the class English's is that fix; drop this once the pin
    moves past 9.0.4. tests/test_book.py searches the Chinese edition in Chromium.
    """
    from sphinx.search.zh import SearchChinese

    class ChineseSearch(SearchChinese):
        language_name = "English"   # the JS class in english-stemmer.js: EnglishStemmer

    return ChineseSearch
