"""`topotune calibrate` without a study: what the cluster store learnt across every study and model."""

from __future__ import annotations

import math

from rich.table import Table

from tuner.cli._app import console, print_json
from tuner.errors import ConfigError


def show_cluster_knowledge(storage_url: str, cluster: str | None, json_out: bool) -> None:
    """Each cluster of the store (or the one named): its learnt factors against the defaults, from how many
    trials and models (kernel factors per group of kernel kinds), the held-out error before and after, what the
    transfer guard decided for each new model, the per-layout offsets and the known launch risks."""
    from tuner.cluster import ClusterStore, GuardVerdict, load_knowledge
    from tuner.hardware import get_gpu

    store = ClusterStore(storage_url)
    keys = [k for k in store.clusters() if cluster is None or k.name == cluster]
    if not keys:
        known = ", ".join(sorted({k.name for k in store.clusters()})) or "none yet"
        raise ConfigError(f"no cluster {cluster!r} in {storage_url}" if cluster else
                          f"no trial recorded in {storage_url}'s cluster store yet", field="--cluster",
                          fix=f"run `topotune tune` first, or pick a cluster (recorded: {known})")
    learnt = [load_knowledge(store, k, get_gpu(k.gpu_class), held_out=True) for k in keys]
    if json_out:
        print_json({"clusters": [k.as_json() for k in learnt]})
        return
    for k in learnt:
        console.print(f"[bold]{k.key.label()}[/]: learnt from {k.runs} trials of {len(k.models)} model(s) "
                      f"({', '.join(k.models) or '-'}), {k.failures} launch failure(s)", highlight=False)
        held = k.held_out
        if held is not None:
            console.print(f"  held-out error ({held.method}, {held.models} models): {_pct(held.error_default)} with "
                          f"the default calibration, {_pct(held.error_fitted)} with the learnt one", highlight=False)
        else:
            console.print("  held-out error: needs trials of two models or more", highlight=False)
        console.print(f"  in-sample error: {_pct(k.error_before)} default, {_pct(k.error_after)} learnt",
                      highlight=False)
        table = Table(title="factors (fitted on this cluster's trials)", title_justify="left")
        for col in ("factor", "default", "learnt", "moved", "from"):
            table.add_column(col, justify="left" if col == "factor" else "right")
        for name, (before, after) in k.moved().items():
            ev = k.evidence.get(name)
            table.add_row(name, f"{before:.4g}", f"{after:.4g}", f"{100 * (after / before - 1):+.1f}%",
                          f"{ev.runs} trials, {ev.models} model(s)" if ev else "-")
        console.print(table)
        if k.kernel_factors:
            kernel = Table(title="kernel factors (each transfers only to models whose kernels match)",
                           title_justify="left")
            for col in ("factor", "transfers to", "default", "learnt", "moved", "from"):
                kernel.add_column(col, justify="left" if col in ("factor", "transfers to") else "right")
            for f in k.kernel_factors:
                kernel.add_row(f.factor, f.group, f"{f.default:.4g}", f"{f.learnt:.4g}",
                               f"{100 * (f.learnt / f.default - 1):+.1f}%" if f.default else "-",
                               f"{f.runs} trials of {', '.join(f.models)}")
            console.print(kernel)
        for g in k.guards:
            verdict = GuardVerdict.from_json(g)
            console.print(f"  transfer guard, study {g.get('study', '?')}: {verdict.summary()}", highlight=False)
            for check in verdict.checks:
                console.print(f"    {check.reason()}", highlight=False)
        if k.layout_offsets:
            worst = sorted(k.layout_offsets.items(), key=lambda kv: -abs(kv[1].log_throughput))[:8]
            console.print(f"  per-layout offsets: {len(k.layout_offsets)} layouts; largest: " + "; ".join(
                f"{role} TP{tp}xDP{dp}{' EP' if ep else ''}{f' MTP{mtp}' if mtp else ''} "
                f"x{math.exp(v.log_throughput):.2f} ({v.models} model(s))"
                for (role, tp, dp, ep, mtp), v in worst), highlight=False)
        for risk in k.risks.values():
            console.print(f"  known risk: {risk.topology.label()}: {risk.status} for {', '.join(risk.models)}",
                          highlight=False)


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x:.1%}"
