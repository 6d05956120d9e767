"""The ``labkit`` command: argument parsing only; each verb calls what the labs call.

labkit doctor                 environment and hardware report (lab 00)
labkit data prepare           download or verify MNIST in $LABKIT_DATA
labkit build-labs [--check]   regenerate labs/ from solutions/ (translations too)
labkit i18n init NAME ...     add a lab to the Chinese edition (a catalog in locale/)
labkit i18n update            merge the English into every catalog (changes: fuzzy)
labkit i18n status            count each catalog's translated, fuzzy, missing entries
labkit measure-labs [NAME ...] time each solution in full mode (the lab headers' compute)
labkit book [--out DIR]       build the course book (full mode; LABKIT_QUICK=1: quick)
labkit bench NAME             run a benchmark (labkit bench --help lists them)
labkit bench allreduce --link 1gbe   the same over a shaped link (root)
"""

import argparse
import sys
from pathlib import Path

__all__ = ["main"]


def _doctor(args) -> int:
    from labkit import hardware

    hardware.print_report()
    return 0


def _prepare(args) -> int:
    from labkit import data

    root = data.prepare(args.root, download=False if args.offline else None)
    print(f"MNIST ready in {root / 'MNIST' / 'raw'} (MD5 verified).")
    return 0


def _build_labs(args) -> int:
    from labkit import course

    changed = course.build_labs(args.solutions, args.labs, check=args.check,
                                references_dir=args.references)
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
    from labkit import course, lab_time

    paths = sorted(Path(args.solutions).glob("*.ipynb"))
    chosen = [p for p in paths if not args.names or any(n in p.name for n in args.names)]
    for path in chosen:
        measured = lab_time.measure(path, quick=args.quick)
        print(f"{path.name}: full mode {measured['full_mode_s']:.0f} s on "
              f"{measured['on']} (load {measured['load']})", flush=True)
    course.build_labs(args.solutions, "labs", references_dir=course.REFERENCES)
    return 0


def _i18n(args) -> int:
    import nbformat

    from labkit import i18n

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
    print("Now translate or confirm the fuzzy and untranslated entries (Poedit), then "
          "run `labkit build-labs` (locale/README.md).")
    return 0


def _book(args) -> int:
    from labkit import book

    book.build(args.out)
    return 0


def _bench(args) -> int:
    from labkit import bench

    options = {"link": args.link} if args.link else {}
    bench.run(args.name, **options)
    return 0


def course_references():
    from labkit import course

    return course.REFERENCES


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="labkit", description=__doc__.split("\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    verbs.add_parser("doctor", help="print the environment report").set_defaults(
        run=_doctor
    )
    data = verbs.add_parser("data", help="manage the MNIST files")
    data_verbs = data.add_subparsers(dest="action", required=True)
    prepare = data_verbs.add_parser("prepare", help="download or verify MNIST")
    prepare.add_argument(
        "--root", default=None, help="data folder (default $LABKIT_DATA)"
    )
    prepare.add_argument("--offline", action="store_true", help="never download")
    prepare.set_defaults(run=_prepare)
    build = verbs.add_parser("build-labs", help="generate labs/ from solutions/")
    build.add_argument("--check", action="store_true", help="exit 1 if labs/ are stale")
    build.add_argument("--solutions", default="solutions")
    build.add_argument("--labs", default="labs")
    build.add_argument("--references", default=str(course_references()),
                       help="where the reference solutions go (labkit's own folder)")
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
    book = verbs.add_parser("book", help="build the course book (static HTML site)")
    book.add_argument("--out", default=None, help="output folder (default build/book/MODE)")
    book.set_defaults(run=_book)
    from labkit.bench import BENCHMARKS   # names only: torch is not imported

    listing = "; ".join(f"{name}: {what}" for name, (*_, what) in BENCHMARKS.items())
    bench = verbs.add_parser("bench", help="run a benchmark", description=listing)
    bench.add_argument("name", choices=sorted(BENCHMARKS))
    bench.add_argument("--link", choices=["1gbe", "10gbe", "25gbe", "lowlat"],
                       help="allreduce only: run its 2 ranks on two network-namespace "
                       "nodes over this shaped link (needs root; env/cluster/)")
    bench.set_defaults(run=_bench)
    return parser


def main(argv=None) -> int:
    """Parse ``argv`` and run the verb; errors from labkit print as one clear line."""
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as err:
        print(f"labkit {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
