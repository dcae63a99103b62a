"""`hetspec profile check`: the placement plan of a profile on this machine, with memory estimates."""

from dataclasses import asdict

from devices import device_info
from orchestrator.errors import HetspecError
from orchestrator.models import resolve
from orchestrator.profiles.memory import MemoryItem, drafter_items, per_device, target_items
from orchestrator.profiles.plan import Plan, fallback_order


def check_profile(profile) -> dict:
    """The plan as a JSON-able dict; `ok` is False when the profile cannot run here (and says why)."""
    plan = profile.plan()
    items, memory_problem = _memory(plan)
    problems = list(plan.problems) + ([memory_problem] if memory_problem else [])
    devices = _device_rows(items)
    problems += [f"{d['device']}: needs {_gib(d['needed'])}, has {_gib(d['total'])}"
                 for d in devices if d["total"] is not None and d["needed"] > d["total"]]
    return {"profile": profile.source, "description": profile.description, "ok": not problems,
            "problems": problems, "fallbacks_taken": plan.fallbacks_taken(),
            "target": _target(plan), "drafter": _drafter(plan),
            "speculation": {"num_speculative_tokens": profile.speculation.num_speculative_tokens,
                            "k_policy": profile.speculation.k_and_policy()[1],
                            "max_speculative_tokens": profile.speculation.k_and_policy()[0],
                            "verification": profile.speculation.verification.describe(),
                            "lossy": profile.speculation.verification.lossy,
                            "overlap": profile.speculation.overlap},
            "memory": [asdict(i) for i in items], "devices": devices,
            "cluster": profile.cluster.model_dump() if profile.cluster else None}


def _target(plan: Plan) -> dict:
    t = plan.profile.target
    used = plan.target
    return {"model": t.model, "wanted": {"device": t.device, "dtype": t.dtype},
            "runs_on": None if used is None else {"device": used.device, "dtype": used.dtype},
            "skipped": [{"device": p.device, "dtype": p.dtype, "reason": why} for p, why in plan.target_skipped]}


def _drafter(plan: Plan) -> dict | None:
    p = plan.profile
    if p.speculation.drafters and p.speculation.num_speculative_tokens != 0:
        return {"wanted": list(p.speculation.drafters), "runs": plan.combined or None,
                "combine": p.speculation.combine,
                "order": [{"name": n, "kind": p.drafters[n].kind, "what": p.drafters[n].describe()}
                          for n in p.speculation.drafters],
                "skipped": [{"name": n, "reason": why} for n, why in plan.drafter_skipped]}
    if p.speculation.drafter is None or p.speculation.num_speculative_tokens == 0:
        return None
    chain = fallback_order(p.drafters, p.speculation.drafter)
    return {"wanted": p.speculation.drafter, "runs": plan.drafter,
            "order": [{"name": n, "kind": p.drafters[n].kind, "what": p.drafters[n].describe()}
                      for n in chain],
            "skipped": [{"name": n, "reason": why} for n, why in plan.drafter_skipped]}


def _memory(plan: Plan) -> tuple[list[MemoryItem], str]:
    """Memory items for what runs (or, where nothing can, what was declared first)."""
    p = plan.profile
    placement = plan.target or p.target
    try:
        ckpt = resolve(p.target.model)
        items = target_items(ckpt, placement.device, placement.dtype, p.target.kv.max_tokens,
                             p.target.kv.block_size)
        name = plan.drafter or (p.speculation.drafter if p.speculation.num_speculative_tokens else None)
        for name in plan.combined or ([name] if name is not None else []):
            items += drafter_items(name, p.drafters[name].drafter_config(), ckpt, p.target.kv.max_tokens,
                                   p.target.kv.block_size)
    except HetspecError as e:
        return [], f"memory estimate: {e}"
    return items, ""


def _device_rows(items: list[MemoryItem]) -> list[dict]:
    rows = []
    for device, needed in per_device(items).items():
        info = device_info(device)
        rows.append({"device": device, "needed": needed, "present": info is not None,
                     "total": info.total_memory if info else None, "free": info.free_memory if info else None})
    return rows


def format_check(report: dict) -> str:
    """The report as text for a terminal."""
    lines = [f"profile {report['profile']}: {report['description']}".rstrip(": ")]
    t = report["target"]
    runs = t["runs_on"]
    where = f"{runs['device']} {runs['dtype']}" if runs else "nowhere here"
    lines.append(f"  target   {t['model'] or 'smollm2-135m'} -> {where}")
    lines += [f"           skipped {s['device']} {s['dtype']}: {s['reason']}" for s in t["skipped"]]
    d = report["drafter"]
    if d is None:
        lines.append("  drafter  none (target only)")
    else:
        lines.append(f"  drafter  {d['runs'] or 'none can run here'} (wanted {d['wanted']}; "
                     f"order: {', '.join(o['name'] + ' = ' + o['what'] for o in d['order'])})")
        lines += [f"           skipped {s['name']}: {s['reason']}" for s in d["skipped"]]
    s = report["speculation"]
    k = s["num_speculative_tokens"]
    k_text = f"auto (cost model, up to {s['max_speculative_tokens']})" if k == "auto" else f"{k} ({s['k_policy']})"
    lines.append(f"  k={k_text}, "
                 f"verification {s['verification']}" + (", drafting overlapped with verification" if s["overlap"] else ""))
    if (c := report.get("cluster")) is not None:
        pools = ", ".join(f"{c[role]['replicas']} {role} on "
                          + (", ".join(f"{k} {v:g}" for k, v in c[role]["resources"].items()) or "CPUs")
                          for role in ("drafters", "targets"))
        lines.append(f"  cluster  {c['engine']} at {c['address']} (namespace {c['namespace']}): {pools} "
                     f"(`hetspec cluster up` places them; the plan below is this host's)")
    lines.append("  memory (estimated):")
    lines += [f"    {m['device']:<8} {m['what']:<32} {_gib(m['nbytes']):>10}  {m['note']}".rstrip()
              for m in report["memory"]]
    for row in report["devices"]:
        has = (f"{_gib(row['free'])} free of {_gib(row['total'])}" if row["present"] and row["total"]
               else "present" if row["present"] else "absent")
        lines.append(f"    {row['device']:<8} total {_gib(row['needed']):>10}  (device: {has})")
    lines += [f"  fallback: {note}" for note in report["fallbacks_taken"]]
    verdict = "runs here" if report["ok"] else "CANNOT RUN HERE"
    lines.append(f"  result: {verdict}" + "".join(f"\n    - {p}" for p in report["problems"]))
    return "\n".join(lines)


def _gib(nbytes: int | None) -> str:
    if nbytes is None:
        return "?"
    return f"{nbytes / (1 << 30):.2f} GiB" if nbytes >= 1 << 30 else f"{nbytes / (1 << 20):.1f} MiB"
