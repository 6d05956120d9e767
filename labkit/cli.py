"""The ``labkit`` command: argument parsing only; each verb calls what the labs call.

labkit doctor                 environment and hardware report (lab 00)
labkit data prepare           download or verify MNIST in $LABKIT_DATA
labkit data prepare --from X  take MNIST's .gz files from folder X or mirror URL X
labkit bench NAME             run a benchmark (labkit bench --help lists them)
labkit bench allreduce --link 1gbe   the same over a shaped link (root)
labkit lock-references        a graded course's image: drop the reference solutions

and, where the course tooling is installed (a checkout; not the learner image):
build-labs, i18n, measure-labs, room, book (``coursetools.cli``). This module is the entry
point above the three layers: it alone imports from all of them.
"""

import argparse
import sys

__all__ = ["main"]


def _doctor(args) -> int:
    from labkit import hardware

    hardware.print_report()
    return 0


def _prepare(args) -> int:
    from labkit import data

    root = data.prepare(args.root, download=False if args.offline else None,
                        source=args.source)
    print(f"MNIST ready in {root / 'MNIST' / 'raw'} (MD5 verified).")
    return 0


def _lock(args) -> int:
    from labkit.checks import _reference

    locked = _reference.lock(args.rooms) if args.rooms else _reference.lock()
    print(f"{len(locked)} reference stores locked: the exercise index stays, the "
          "reference solutions' code is gone (checks.use_reference says so).")
    return 0


def _bench(args) -> int:
    from labkit import labs

    options = {"link": args.link} if args.link else {}
    labs.run_benchmark(args.name, **options)
    return 0


# The course tooling's verbs (coursetools.cli.VERBS), named here so that they keep
# their names where the tooling is not installed (the learner image).
TOOLING_VERBS = ("build-labs", "i18n", "measure-labs", "room", "book")


def _tooling():
    """Return the course tooling's command line, or None where it is not installed.

    The one place the runtime names the tooling: ``labkit`` is the entry point above
    the layers (runtime, rooms, tooling) and dispatches to each."""
    try:
        from coursetools import cli as tooling
    except ImportError:
        return None
    return tooling


def _not_installed(verb: str) -> int:
    print(f"labkit {verb}: this verb belongs to the course tooling (coursetools), "
          "which is not installed here: the learner image leaves it out. From a "
          "checkout of the course: `pip install -e tooling` (make lab and make test "
          "do), then run it again.", file=sys.stderr)
    return 2


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
    prepare.add_argument(
        "--from", dest="source", default=None, metavar="FOLDER_OR_URL",
        help="a folder holding the four original .gz files, or a mirror's URL "
        "(default $LABKIT_MNIST_MIRROR); MD5-checked",
    )
    prepare.set_defaults(run=_prepare)
    lock = verbs.add_parser("lock-references", help="for a graded course's image: "
                            "drop the reference solutions (checks.use_reference)")
    lock.add_argument("--rooms", default=None,
                      help="the rooms folder (default: this labkit's labkit/labs)")
    lock.set_defaults(run=_lock)
    tooling = _tooling()
    if tooling is not None:
        tooling.add_verbs(verbs)
    from labkit.labs import BENCHMARKS   # names only: torch is not imported

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
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TOOLING_VERBS and _tooling() is None:
        return _not_installed(argv[0])
    args = _parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, RuntimeError) as err:
        print(f"labkit {args.verb}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
