"""coursetools: the tooling that builds and checks the course; not in the learner image.

Taught in: nowhere (for maintainers and instructors). It sits above the labs' rooms
and the runtime (``labkit``), and nothing in them imports it:

- ``notebooks``: solution notebooks and what is made from them (learner version,
  exercises, hardware metadata);
- ``build``: ``labkit build-labs``: labs/, nbgrader metadata, references, times;
- ``i18n``: the translated editions, from gettext catalogs that cannot drift;
- ``times``: how long a lab takes (a model with stated inputs, or a room's own
  figure), and INSTRUCTORS.md's table; ``measure``: ``labkit measure-labs``;
- ``tracks``: the tracks, checked (prerequisites, primers, a day that fits) and
  scheduled; ``gpus``: what a room needs; ``room``: ``labkit room gather``;
- ``book``: the course book (Sphinx + myst-nb);
- ``cli``: these verbs, which the ``labkit`` command adds where this is installed.

Install it from a checkout with ``pip install -e tooling`` (``make lab`` and
``make test`` do).
"""
