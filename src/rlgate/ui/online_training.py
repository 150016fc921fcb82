"""The online-training part of ``/ui/online``: the canary's state, its test and decisions, the trainer's staleness,
the reward-hacking guards firing."""

from __future__ import annotations

import time

from rlgate.online.training import OnlineTraining
from rlgate.ui.escape import e


def training_section(training: OnlineTraining) -> str:
    """HTML: canary state + running comparison, the last decisions (newest first), the trainer's counters."""
    snap = training.canary.snapshot()
    cmp = snap["comparison"]
    test = ("no canary running" if cmp is None else
            f"canary - stable: {cmp['diff']:+.3f}, always-valid interval [{cmp['lower']:+.3f}, {cmp['upper']:+.3f}] "
            f"({cmp['n_canary']} canary rewards, {cmp['n_stable']} stable)")
    decisions = "".join(
        f"<tr><td>{e(time.strftime('%H:%M:%S', time.localtime(d['at'])))}</td><td>{e(d['action'])}</td>"
        f"<td>{e(d['version'])}</td><td>{e(d['by'])}</td><td>{e(d['reason'])}</td></tr>"
        for d in reversed(snap["decisions"]))
    of = f" (policy {e(training.policy)})" if training.policy is not None else ""
    out = (
        f"<h1>online training{of}: canary</h1>"
        f"<p>state <b>{e(snap['state'])}</b>; stable version {e(snap['stable_version'])}; canary version "
        f"{e(snap['canary_version'] if snap['canary_version'] is not None else '-')} "
        f"(share {snap['canary_share']:.0%} of new conversations); {e(test)}; "
        f"{snap['switched_conversations']} conversations moved off their version</p>"
        "<table class=\"online\"><thead><tr><th>at</th><th>decision</th><th>version</th><th>by</th><th>why</th>"
        f"</tr></thead><tbody>{decisions or '<tr><td colspan=5>no decision yet</td></tr>'}</tbody></table>")
    t = training.trainer
    if t is not None:
        last = t.last_step
        stale = ("no step yet" if not last else
                 f"last step: staleness {last['staleness_versions_mean']:.2f} versions on average (max "
                 f"{last['staleness_versions_max']:.0f}), {last['staleness_hours_mean'] * 60:.1f} minutes on average "
                 f"(max {last['staleness_hours_max'] * 60:.1f})")
        counts = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in t.counts.items())
        out += (f"<h1>online training{of}: trainer</h1><p>{e(stale)}; {t.pending_samples} samples waiting; "
                f"weights published as version {t.version}</p><p>{e(counts)}</p>")
    h = training.hacking
    if h is not None:
        snap_h = h.snapshot()
        firing = "; ".join(f"{f['guard']} on version {f['version']}: {f['reason']}" for f in snap_h["firing"])
        out += (f"<h1>online training{of}: reward-hacking guards ({e(snap_h['action'])})</h1><p>"
                + e(firing or ("none firing" if snap_h["reference"] is not None else
                               "measuring the reference (the starting version's replies)"))
                + "</p>")
    g = training.groups
    if g is not None:
        out += "<p>live groups: " + e(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in g.snapshot().items())) + "</p>"
    return out
