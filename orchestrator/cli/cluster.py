"""`hetspec cluster up|status|down`: a profile's drafter pool and target replicas on Ray."""

import argparse
import json

from orchestrator.profiles import parse_profile, read_profile_text


def add_parser(sub, parser_class) -> None:
    c = sub.add_parser("cluster", help="drafter pools and target replicas on a Ray cluster (the [ray] extra)")
    csub = c.add_subparsers(dest="cluster_command", required=True, parser_class=parser_class)
    for verb, text in (("up", "start the profile's actors on its Ray cluster and wait until they answer"),
                       ("status", "every actor: where it runs, its address, load and drafter state"),
                       ("down", "stop and remove the profile's actors")):
        p = csub.add_parser(verb, help=text)
        p.add_argument("--profile", required=True, metavar="FILE|NAME", help="a profile with a cluster: section")
        if verb != "down":
            p.add_argument("--json", action="store_true", help="one JSON object")
        p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text, source = read_profile_text(args.profile)
    profile = parse_profile(text, source)
    from orchestrator.cluster import Cluster  # imports ray: only here

    cluster = Cluster(profile, text)
    if args.cluster_command == "down":
        print(f"removed {cluster.down()} actors from namespace {profile.cluster.namespace!r}")
        return 0
    state = cluster.up(progress=not args.json) if args.cluster_command == "up" else cluster.status()
    if args.json:
        print(json.dumps(state.to_dict()))
        return 0
    for a in state.drafters + state.targets:
        if a["state"] != "ready":
            print(f"{a['name']:<12} {a['state']}")
        elif a["role"] == "drafter":
            print(f"{a['name']:<12} {a['address']:<22} {a['kind']} drafter, {a['sessions']} sessions, "
                  f"{a['sequences']} sequences (node {a['node'][:12]})")
        else:
            print(f"{a['name']:<12} {a['address']:<22} target, {a['running']} running, {a['waiting']} waiting, "
                  f"drafter {a['drafter_state']} {a.get('drafter_address', '')} (node {a['node'][:12]})")
    return 0 if all(a["state"] == "ready" for a in state.drafters + state.targets) else 1
