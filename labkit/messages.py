"""labkit's own messages in the learner's language (gettext).

Taught in: nowhere (course tooling; locale/README.md is the translator's guide). A
sentence labkit prints for the learner is written ``_("English, {fields}").format(...)``
(never an f-string inside ``_``: the catalog holds the template, the fields are filled
after the translation); a constant translated where it is used is marked ``N_``. ``_`` looks the template up in the catalog
``labkit/locale/<lang>/LC_MESSAGES/labkit.po`` (inside the package, so that a
non-editable install, such as the course image's, speaks it too) for the language ``language()`` chooses,
and returns the English when the language is English or the entry is missing or fuzzy
(as gettext does). ``labkit i18n update`` refreshes the catalog from the sources with
Babel's extractor (``coursetools.i18n.messages_in_sources``); tests fail on a marked
module's message that is not marked, and on an entry left untranslated.
"""

import functools
import os
import re
from pathlib import Path

__all__ = ["DOMAIN", "CATALOGS", "language", "catalog_path", "_", "N_", "Said"]

DOMAIN = "labkit"
CATALOGS = Path(__file__).resolve().parent / "locale"   # package data
_LANG = re.compile(r"^[a-z]{2,3}_[A-Z]{2}$")


def language(environ=None, cwd=None) -> str:
    """Return the language labkit speaks: $LABKIT_LANG, else the notebook's folder
    (a kernel started for labs/zh_CN/04.ipynb: ``zh_CN``), else ``en``.

    Ranks inherit both the environment and the notebook's working directory, so they
    speak the notebook's language too.
    """
    environ = os.environ if environ is None else environ
    chosen = environ.get("LABKIT_LANG", "").strip()
    if chosen:
        return chosen.split(".")[0].replace("-", "_")
    session = environ.get("JPY_SESSION_NAME")   # the notebook's path, set by Jupyter
    for folder in ([Path(session).parent.name] if session else []) + [
            Path(cwd if cwd is not None else os.getcwd()).name]:
        if _LANG.match(folder):
            return folder
    return "en"


def catalog_path(lang: str) -> Path:
    """Where the catalog of labkit's messages in ``lang`` lives."""
    return CATALOGS / lang / "LC_MESSAGES" / f"{DOMAIN}.po"


@functools.cache
def _translations(lang: str) -> dict:
    path = catalog_path(lang)
    if lang == "en" or not path.exists():
        return {}
    import polib

    return {entry.msgid: entry.msgstr
            for entry in polib.pofile(str(path)).translated_entries()}


def _(message: str) -> str:
    """Return ``message`` (an English template) in the learner's language."""
    return _translations(language()).get(message, message)


def N_(message: str) -> str:
    """Mark ``message`` for the catalog without translating it now (a constant that
    is translated where it is used, ``_(CONSTANT)``)."""
    return message


class Said(str):
    """A constant's text (a figure's source, a cluster's name) that prints in the
    learner's language (``_`` at each use: ``print(link.source)``, an f-string), while
    it compares and hashes as its English. Mark its literal ``N_`` for the catalog."""

    def __str__(self) -> str:
        return _(str.__str__(self))

    def __format__(self, spec: str) -> str:
        return format(str(self), spec)
