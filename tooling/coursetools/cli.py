"""The course tooling's verbs, run as ``labkit VERB`` (or ``python -m coursetools VERB``).

labkit build-labs [--check]   regenerate labs/ from solutions/ (translations too)
labkit i18n init NAME ...     add a lab to the Chinese edition (a catalog in locale/)
labkit i18n update            merge the English into every catalog (changes: fuzzy)
labkit i18n status            count each catalog's translated, fuzzy, missing entries
labkit measure-labs [NAME ...] time each solution in full mode (the lab headers' compute)
labkit room gather PATH ...   a room's progress files as one table (--apply: into the
                              lab headers and INSTRUCTORS.md, in place of the estimates)
labkit book [--out DIR]       build the course book (full mode; LABKIT_QUICK=1: quick)

Argument parsing only; each verb calls the tooling's modules. The ``labkit`` command
(labkit/cli.py) adds these verbs where the tooling is installed, and says where they
went where it is not (the learner image).
"""

import argparse
import sys
from pathlib import Path

__all__ = ["VERBS", "add_verbs", "main"]

VERBS = ("build-labs", "i18n", "measure-labs", "room", "book")


def _rooms() -> Path:
    from coursetools import build

    return build.ROOMS


def _build_labs(args) -> int:
    from coursetools import build

    changed = build.build_labs(args.solutions, args.labs, check=args.check,
                               rooms_dir=args.rooms)
    if args.check:
        for path in changed:
            print(f"stale: {path} (run `labkit build-labs`)" if isinstance(path, Path)
                  else f"out of sync: {path}")
        print("labs/, nbgrader metadata, references and translations are up to date."
              if not changed else f"{len(changed)} stale file(s) or catalog entries.")
        return 1 if changed else 0
    for path in changed:
        print(f"wrote {path}")
    print(f"Wrote {len(changed)} file(s)." if changed else "Everything was up to date.")
    return 0


def _measure_labs(args) -> int:
    from coursetools import build, measure

    paths = sorted(Path(args.solutions).glob("*.ipynb"))
    chosen = [p for p in paths if not args.names or any(n in p.name for n in args.names)]
    for path in chosen:
        measured = measure.measure(path, quick=args.quick)
        print(f"{path.name}: full mode {measured['full_mode_s']:.0f} s on "
              f"{measured['on']} (load {measured['load']})", flush=True)
    build.build_labs(args.solutions, "labs", rooms_dir=build.ROOMS)
    return 0


def _i18n(args) -> int:
    import nbformat

    from coursetools import i18n

    solutions, locale = Path(args.solutions), Path(args.locale)
    if args.action == "status":
        for row in i18n.status(locale):
            print(f"{row['catalog']}: {row['entries']} entries, {row['translated']} "
                  f"translated, {row['fuzzy']} fuzzy, {row['untranslated']} "
                  f"untranslated, {row['obsolete']} obsolete")
        for lang in sorted({row["lang"] for row in i18n.status(locale)}):
            problems = i18n.runtime_problems(lang, i18n.runtime_catalog(locale, lang))
            print(f"{i18n.runtime_catalog(locale, lang)}: labkit's messages, "
                  f"{len(problems)} not translated")
        return 0
    if args.action == "init":
        for name in args.names:
            found = sorted(solutions.glob(f"{name}*.ipynb"))
            if len(found) != 1:
                raise ValueError(f"{name!r} names {len(found)} notebooks in "
                                 f"{solutions}: give one, e.g. 04_model_parallel")
            path = locale / args.lang / "LC_MESSAGES" / f"{found[0].stem}.po"
            if not path.exists():
                i18n.update(path, nbformat.read(found[0], as_version=4), args.lang,
                            found[0].stem)
                print(f"created {path}")
    for lang, stem, path in i18n.catalogs(locale):
        source = solutions / f"{stem}.ipynb"
        if not source.exists():
            print(f"{path}: no {source}: nothing merged")
            continue
        counts = i18n.update(path, nbformat.read(source, as_version=4), lang, stem)
        print(f"{path}: {counts['entries']} entries ({counts['new']} new, "
              f"{counts['fuzzy']} fuzzy, {counts['untranslated']} untranslated, "
              f"{counts['obsolete']} obsolete)")
    for lang in sorted({lang for lang, _stem, _path in i18n.catalogs(locale)}):
        path = i18n.runtime_catalog(locale, lang)
        counts = i18n.update_runtime(lang, path)
        print(f"{path}: {counts['entries']} messages of labkit ({counts['new']} new, "
              f"{counts['untranslated']} untranslated, {counts['obsolete']} obsolete)")
        _update_guide(locale, lang, solutions.parent / "INSTRUCTORS.md")
    print("Now translate or confirm the fuzzy and untranslated entries (Poedit), then "
          "run `labkit build-labs` (locale/README.md).")
    return 0


def _update_guide(locale: Path, lang: str, english: Path) -> None:
    """Merge INSTRUCTORS.md into the ``lang`` edition's guide catalog."""
    from coursetools import guides

    if not english.exists():
        return
    path = locale / lang / "LC_MESSAGES" / f"{guides.DOMAIN}.po"
    counts = guides.update(path, english.read_text(encoding="utf-8"), lang)
    print(f"{path}: {counts['entries']} parts of INSTRUCTORS.md ({counts['new']} new, "
          f"{counts['fuzzy']} fuzzy, {counts['untranslated']} untranslated, "
          f"{counts['obsolete']} obsolete)")


def _room(args) -> int:
    from coursetools import build, room, times
    from labkit import progress

    gathered = room.gather(args.paths, args.solutions)
    if not gathered["files"]:
        raise ValueError(f"no {progress.FILE_NAME} under {', '.join(args.paths)}: "
                         "did the room record (LABKIT_RECORD=1, INSTRUCTORS.md)?")
    print(room.table(gathered), end="")
    if args.apply:
        for path in room.apply(gathered, args.solutions):
            print(f"wrote the room's figure into {path}")
        build.build_labs(args.solutions, "labs", rooms_dir=build.ROOMS)
        print("labkit build-labs: the lab headers and INSTRUCTORS.md now state the "
              f"room's figures where at least {times.ROOM_MIN_LEARNERS} learners "
              "finished a lab.")
    return 0


def _book(args) -> int:
    from coursetools import book

    book.build(args.out)
    return 0


def add_verbs(verbs) -> None:
    """Add the tooling's verbs to an ``argparse`` subparsers object."""
    build = verbs.add_parser("build-labs", help="generate labs/ from solutions/")
    build.add_argument("--check", action="store_true", help="exit 1 if labs/ are stale")
    build.add_argument("--solutions", default="solutions")
    build.add_argument("--labs", default="labs")
    build.add_argument("--rooms", default=str(_rooms()),
                       help="the labs' rooms, where each lab's reference.json goes")
    build.set_defaults(run=_build_labs)
    i18n = verbs.add_parser("i18n", help="translation catalogs (locale/README.md)")
    i18n_verbs = i18n.add_subparsers(dest="action", required=True)
    for action, what in [("init", "create the catalogs of these labs, then update"),
                         ("update", "merge the English into every catalog"),
                         ("status", "count each catalog's entries")]:
        verb = i18n_verbs.add_parser(action, help=what)
        if action == "init":
            verb.add_argument("names", nargs="+", help="notebooks, e.g. 04_model")
            verb.add_argument("--lang", default="zh_CN", help="default zh_CN")
        verb.add_argument("--solutions", default="solutions")
        verb.add_argument("--locale", default="locale")
        verb.set_defaults(run=_i18n)
    measure = verbs.add_parser("measure-labs", help="time each lab in full and quick "
                               "mode; build-labs then writes the headers' times")
    measure.add_argument("names", nargs="*", help="notebooks to measure (default all)")
    measure.add_argument("--solutions", default="solutions")
    measure.add_argument("--quick", action="store_true", help="time quick mode too")
    measure.set_defaults(run=_measure_labs)
    room = verbs.add_parser("room", help="a room's own times (INSTRUCTORS.md)")
    room_verbs = room.add_subparsers(dest="action", required=True)
    gather = room_verbs.add_parser("gather", help="gather the learners' progress files")
    gather.add_argument("paths", nargs="+", help="files, or folders searched for "
                        "labkit-progress*.jsonl (e.g. nbgrader's submitted/)")
    gather.add_argument("--solutions", default="solutions")
    gather.add_argument("--apply", action="store_true", help="store each lab's figure "
                        "in its solution, then build-labs")
    gather.set_defaults(run=_room)
    book = verbs.add_parser("book", help="build the course book (static HTML site)")
    book.add_argument("--out", default=None, help="output folder (default build/book/MODE)")
    book.set_defaults(run=_book)


def main(argv=None) -> int:
    """Parse ``argv`` and run a tooling verb; errors print as one clear line."""
    parser = argparse.ArgumentParser(prog="python -m coursetools",
                                     description=__doc__.split("\n")[0])
    add_verbs(parser.add_subparsers(dest="verb", required=True))
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as err:
        print(f"coursetools {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
