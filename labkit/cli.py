"""The ``labkit`` command: argument parsing only; each verb calls what the labs call.

labkit doctor                 environment and hardware report (lab 00)
labkit data prepare           download or verify MNIST in $LABKIT_DATA
labkit build-labs [--check]   regenerate labs/ from solutions/
labkit measure-labs [NAME ...] time each solution in full and quick mode (lab headers)
labkit book [--out DIR]       build the course book (full mode; LABKIT_QUICK=1: quick)
labkit bench NAME             run a benchmark (labkit bench --help lists them)
labkit bench allreduce --link 1gbe   the same over a shaped link (root)
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

    root = data.prepare(args.root, download=False if args.offline else None)
    print(f"MNIST ready in {root / 'MNIST' / 'raw'} (MD5 verified).")
    return 0


def _build_labs(args) -> int:
    from labkit import course

    changed = course.build_labs(args.solutions, args.labs, check=args.check,
                                references_dir=args.references)
    if args.check:
        for path in changed:
            print(f"stale: {path} (run `labkit build-labs`)")
        print("labs/, nbgrader metadata and references are up to date."
              if not changed else f"{len(changed)} stale file(s).")
        return 1 if changed else 0
    for path in changed:
        print(f"wrote {path}")
    print(f"Wrote {len(changed)} file(s)." if changed else "Everything was up to date.")
    return 0


def _measure_labs(args) -> int:
    from pathlib import Path

    from labkit import course, lab_time

    paths = sorted(Path(args.solutions).glob("*.ipynb"))
    chosen = [p for p in paths if not args.names or any(n in p.name for n in args.names)]
    for path in chosen:
        measured = lab_time.measure(path)
        print(f"{path.name}: full mode {measured['full_mode_s']:.0f} s, quick mode "
              f"{measured['quick_mode_s']:.0f} s ({measured['on']})", flush=True)
    course.build_labs(args.solutions, "labs", references_dir=course.REFERENCES)
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
    measure = verbs.add_parser("measure-labs", help="time each lab in full and quick "
                               "mode; build-labs then writes the headers' times")
    measure.add_argument("names", nargs="*", help="notebooks to measure (default all)")
    measure.add_argument("--solutions", default="solutions")
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
