"""coursetools: the tooling that builds and checks the course; not in the learner image.

Taught in: nowhere (for maintainers and instructors). It sits above the labs' rooms
and the runtime (``labkit``), and nothing in them imports it:

- ``notebooks``: solution notebooks and what is made from them (learner version,
  exercises, hardware metadata);
- ``build``: ``labkit build-labs``: labs/, nbgrader metadata, references, times;
- ``i18n``: the translated editions, from gettext catalogs that cannot drift;
- ``times``: how long a lab takes, and INSTRUCTORS.md's tables;
- ``book``: the course book (Sphinx + myst-nb);
- ``cli``: these verbs, which the ``labkit`` command adds where this is installed.

Install it from a checkout with ``pip install -e tooling`` (``make lab`` and
``make test`` do).
"""
