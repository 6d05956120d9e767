"""DDP communication hooks on a real shaped link, next to the ``sleep`` emulation.

Taught in: lab 06, section 3 (``compression_on_link``: PowerSGD on a tbf-shaped link
between two namespace nodes; ``labkit bench allreduce --link``). The real link needs
root (``labkit.cluster.unavailable()`` says why not); the emulation runs anywhere.
"""


from labkit import cluster
from labkit.labs.communication import compression
from labkit.messages import _

__all__ = ["compression_on_link"]


def compression_on_link(profile="1gbe", specs=("allreduce", "powersgd-1"),
                        steps: int = 40, width: int = 512, limit: int = 4096,
                        cfg=None, emulated=None, verbose: bool = True) -> dict:
    """Time DDP hooks on the ``sleep`` emulation and, as root, on a real shaped link.

    Both train the lab's MLP (784-width-width-10) with each hook on 2 gloo ranks for
    ``steps`` steps (PowerSGD's warm-up: the first quarter), or with ``cfg`` (a
    ``compression.CompressionConfig``). Emulation: the ranks run here, and
    ``ByteCounter`` sleeps each all-reduce's bytes x 2(N-1)/N at the link's rate
    (``compression.train_variants``'s slow-link steps); ``emulated`` passes results
    of that run already made (lab 06, section 3), matched by hook name. Real: one
    rank in each of two namespace nodes, the link shaped by tbf, no sleep. Both run
    gloo CPU ranks: given results from another backend (section 3 on NCCL, as root
    on a GPU machine) are measured again on gloo before a real run. Returns
    ``{"rows", "reason", "link", "emulated", "real"}``: per hook the bytes per step,
    the ms per step here, emulated and real (None without root), and its bytes'
    time on the wire; ``reason`` says why there is no real run.
    """
    from labkit import launch

    chosen = cluster.link(profile)
    if chosen.rate_bits is None:
        raise ValueError(_("compression_on_link needs a link with a rate (1gbe, ...)."))
    if cfg is None:
        cfg = compression.CompressionConfig(
            steps=steps, width=width, limit=limit, test_limit=1000,
            powersgd_start=max(2, steps // 4), slow_steps=max(3, steps // 4),
            slow_link_gbytes_per_s=chosen.bytes_per_s / 1e9)
    reason = cluster.unavailable()
    ran_on = {r.get("backend", "gloo") for r in emulated or []} - {"gloo"}
    if ran_on and reason is None:   # NCCL's GPU ranks next to the link's CPU ranks
        if verbose:
            print(_("The emulation given ran on {backend}; the real link carries gloo "
                    "CPU ranks, so it runs again on gloo: both columns then time the "
                    "same CPU ranks.").format(backend=", ".join(sorted(ran_on))))
        emulated = None
    if emulated is None:   # on gloo, as the real link's ranks
        emulated = launch.run(compression.train_variants, 2, args=(cfg, list(specs)),
                              backend="gloo", timeout=300)[0]
    names = [compression.label(spec) for spec in specs]
    by_name = {r["name"]: r for r in emulated}
    emulated = [by_name[name] for name in names]
    real = None
    if reason is None:
        with cluster.Cluster(2, chosen, verbose=False) as box:
            real = box.launch(compression.train_variants, args=(cfg, list(specs)),
                              timeout=300)[0]
    rows = []
    for i, spec in enumerate(specs):
        row = {"hook": emulated[i]["name"], "bytes_per_step":
               emulated[i]["bytes_per_step"], "local_ms": emulated[i]["ms_per_step"],
               "emulated_ms": emulated[i]["slow_link_ms"],
               "real_ms": real[i]["ms_per_step"] if real else None,
               "wire_ms": 1e3 * emulated[i]["bytes_per_step"] / chosen.bytes_per_s}
        rows.append(row)
    if verbose:
        print(_("MLP 784-{width}-{width}-10, 2 ranks, {steps} steps per hook; emulated "
                "link {gbytes_per_s:g} GB/s; real link {link}").format(
                    width=cfg.width, steps=cfg.steps,
                    gbytes_per_s=cfg.slow_link_gbytes_per_s, link=chosen.describe()))
        names = [_("hook"), _("bytes/step"), _("on the wire"), _("local"),
                 _("emulated"), _("real link")]
        print(f"{names[0]:<12}" + "".join(f"{name:>{width}}" for name, width in
                                          zip(names[1:], (12, 13, 9, 10, 11)))
              + "   " + _("(ms per step)"))
        for r in rows:
            real_ms = f"{r['real_ms']:>11.1f}" if r["real_ms"] is not None else \
                f"{'-':>11}"
            print(f"{r['hook']:<12}{r['bytes_per_step']:>12,}{r['wire_ms']:>13.1f}"
                  f"{r['local_ms']:>9.1f}{r['emulated_ms']:>10.1f}{real_ms}")
        if reason:
            print(_("real shaped link: {reason}; skipped, the emulation alone above.")
                  .format(reason=reason))
    return {"rows": rows, "reason": reason, "link": chosen.describe(),
            "emulated": emulated, "real": real}

