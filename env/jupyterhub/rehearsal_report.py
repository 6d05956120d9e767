"""The rehearsal's report: the figures INSTRUCTORS.md quotes, and the verdict (for
rehearse.py)."""

import os
import statistics
import time

__all__ = ["summarise", "print_report", "machine"]


def summarise(report: dict, options) -> dict:
    """Add the figures the instructor guide quotes, and the verdict."""
    learners = report["learners"]
    if report.get("stopped"):
        done = {n: len(r.get("cells", [])) for n, r in learners.items()}
        report["summary"] = {"learners": len(learners), "lab": options.lab,
                             "stopped": report["stopped"], "cells_run": done,
                             "peak_pss_mib_max": round(max(
                                 v["pss"] for v in report["peak_mib"].values()))}
        report["ok"] = False
        return report
    seconds = [r["seconds"] for r in learners.values() if "seconds" in r]
    errors = {n: r["errors"] for n, r in learners.items() if r["errors"]}
    idle = [v["pss"] for v in report["idle_mib"].values()]
    peak = [v["pss"] for v in report["peak_mib"].values()]
    report["summary"] = {
        "learners": len(learners), "lab": options.lab, "finished": len(seconds),
        "median_s": round(statistics.median(seconds), 1) if seconds else None,
        "max_s": max(seconds, default=None),
        "idle_pss_mib_median": round(statistics.median(idle)),
        "idle_pss_mib_max": round(max(idle)),
        "idle_rss_mib_max": round(max(v["rss"] for v in report["idle_mib"].values())),
        "peak_pss_mib_max": round(max(peak)),
        "peak_rss_mib_max": round(max(v["rss"] for v in report["peak_mib"].values())),
        "learners_with_errors": sorted(errors),
        # killed (for memory, most often) and restarted empty: the server said so
        "kernels_died": sorted(n for n, r in learners.items() if "kernel_died_at_cell" in r),
        "cpu_s_median": round(statistics.median(report["cpu_s"].values()), 1),
        "reconnects": sum(r.get("reconnects", 0) for r in learners.values())}
    # A learner's own `!torchrun` listens on every interface (torch has no option to
    # bind it; lab 03 says so, the guide fences it): reported, not a labkit failure.
    by_labkit = [e for e in report["exposed"] if e[3] != "torchrun typed by the learner"]
    report["summary"]["exposed_by_labkit"] = by_labkit
    report["summary"]["exposed_by_learners_torchrun"] = (len(report["exposed"])
                                                         - len(by_labkit))
    report["ok"] = not (errors or by_labkit or report["isolation"]
                        or report["leftovers"] or len(seconds) < len(learners))
    return report


def print_report(report: dict) -> None:
    s, m = report["summary"], report["machine"]
    if report.get("stopped"):
        print(f"\n{s['learners']} learners, {s['lab']}: {s['stopped']}; load before "
              f"{m['load_before']:.1f}, max {report['load_max']:.1f}; memory available "
              f"min {report['available_min_mib']:,.0f} MiB; peak PSS per learner "
              f"{s['peak_pss_mib_max']} MiB; cells run per learner: {s['cells_run']}")
        print("FAILED")
        return
    print(f"\n{s['learners']} learners, {s['lab']} (quick mode), on {m['cores']} cores, "
          f"{m['memory_gib']:.1f} GiB; load before {m['load_before']:.1f}, max "
          f"{report['load_max']:.1f}; memory available min "
          f"{report['available_min_mib']:,.0f} MiB")
    print(f"servers ready in {report['servers_ready_s']} s; finished {s['finished']}/"
          f"{s['learners']}: median {s['median_s']} s, max {s['max_s']} s")
    print(f"per learner: {s['cpu_s_median']} CPU seconds (median); websockets "
          f"reopened: {s['reconnects']}; kernels that died: "
          f"{', '.join(s['kernels_died']) or 'none'}")
    print(f"per learner, MiB: idle PSS median {s['idle_pss_mib_median']}, max "
          f"{s['idle_pss_mib_max']} (RSS max {s['idle_rss_mib_max']}); peak PSS max "
          f"{s['peak_pss_mib_max']} (RSS max {s['peak_rss_mib_max']})")
    for name, result in sorted(report["learners"].items()):
        for error in result["errors"]:
            print(f"  {name} cell {error['cell']}: {error['error'][:300]}")
    print(f"listening sockets seen: {report['listeners']}; beyond loopback, by labkit "
          f"or a kernel: {s['exposed_by_labkit'] or 'none'}; by learners' own "
          f"torchrun (lab 03's `!torchrun` cell): {s['exposed_by_learners_torchrun']}")
    print(f"isolation problems: {report['isolation'] or 'none'}")
    print(f"left in a learner's temp folder after a graceful kernel shutdown: "
          f"{sorted({e for v in report['tmp_after_kernel'].values() for e in v})}")
    print(f"left after the servers stopped: {report['leftovers'] or 'nothing'}")
    print("OK" if report["ok"] else "FAILED")


def machine() -> dict:
    import psutil

    return {"cores": os.cpu_count(), "load_before": os.getloadavg()[0],
            "memory_gib": psutil.virtual_memory().total / 2**30,
            "available_before_mib": psutil.virtual_memory().available / 2**20,
            "date": time.strftime("%Y-%m-%d %H:%M")}


