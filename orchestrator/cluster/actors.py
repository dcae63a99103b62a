"""The two kinds of actor, as plain classes (`deploy` wraps them with `ray.remote`).

A `DrafterWorker` is `hetspec drafter serve` inside an actor; a `TargetReplica` is `hetspec serve`
inside an actor, its drafter a session to the pool. Each listens on the node's address (or
127.0.0.1, `cluster.bind: localhost`) on a free port, and reports it with its load in `info()`.
"""

import dataclasses
import logging
import os

import ray

from orchestrator.assemble import assemble, build_drafter_servicer
from orchestrator.cluster.pool import PoolDrafterConfig, build_pool_drafter
from orchestrator.profiles import Profile, parse_profile
from orchestrator.profiles.schema import RemoteDrafterSpec
from orchestrator.server import EngineLoop, GenerationServicer, server_options, start_server
from orchestrator.tracing import Tracer


def _host(bind: str) -> str:
    return "127.0.0.1" if bind == "localhost" else ray.util.get_node_ip_address()


def _where() -> dict:
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


class DrafterWorker:
    """The profile's drafter (`speculation.drafter`) served as `hetspec.v1.Drafter` sessions."""

    def __init__(self, profile_text: str, source: str, bind: str):
        logging.basicConfig(level=logging.WARNING)
        profile = parse_profile(profile_text, source)
        self.servicer, config = build_drafter_servicer(profile, profile.speculation.drafter, progress=False)
        self.kind = config.drafter_kind
        options = server_options(profile, _host(bind), 0, 0)
        self.served = start_server(options, [self.servicer.register])
        self.address = f"{options.host}:{self.served.port}"

    def info(self) -> dict:
        sessions, sequences = self.servicer.load()
        return {"role": "drafter", "address": self.address, "kind": self.kind, "sessions": sessions,
                "sequences": sequences, **_where()}

    def stop(self) -> None:
        self.served.stop(1.0)
        self.servicer.drafter.close()


def replica_profile(profile: Profile, drafter_timeout_s: float) -> Profile:
    """The profile a target replica places: its drafter a remote one (the pool's), with hidden
    states for an MTP drafter and K/V handoff where the served drafter takes it."""
    name = profile.speculation.drafter
    if name is None:
        return profile
    served = profile.drafters[name]
    handoff = getattr(served, "kv_handoff", False)
    if handoff == "auto":  # an onnx self-drafter
        handoff = served.model is None
    remote = RemoteDrafterSpec(kind="remote", address="pool:1", timeout_s=drafter_timeout_s,
                               kv_handoff=handoff, hidden_states=served.kind == "mtp")
    drafters = {**profile.drafters, name: remote}
    return profile.model_copy(update={"drafters": drafters})


class TargetReplica:
    """The profile's target and engine behind `hetspec.v1.Generation`, drafting through the pool."""

    def __init__(self, profile_text: str, source: str, bind: str, index: int, drafter_timeout_s: float):
        logging.basicConfig(level=logging.WARNING)
        profile = parse_profile(profile_text, source)
        s = profile.server
        config = replica_profile(profile, drafter_timeout_s).engine_config()  # placement on this node's devices
        config = dataclasses.replace(config, max_num_seqs=min(config.max_num_seqs, s.max_concurrent_requests))
        if config.drafter is not None:
            config = dataclasses.replace(config, drafter=PoolDrafterConfig(config.drafter, index=index))
        # built and stepped on the loop's thread, the only one running torch (the actor's main thread
        # serves its calls): a second OpenMP team halved a CPU target's speed (server/engine_loop.py)
        self.loop = EngineLoop.built_on_own_thread(
            lambda: assemble(config, Tracer(enabled=False), progress=False,
                             builders={PoolDrafterConfig: build_pool_drafter}).engine(),
            config.drafter_kind, max_active=s.max_concurrent_requests + s.max_queued_requests)
        self.engine = self.loop.engine
        servicer = GenerationServicer(self.loop, self.engine.tokenizer, max_new_tokens_limit=s.max_new_tokens)
        options = server_options(profile, _host(bind), 0, 0)
        self.served = start_server(options, [servicer.register])
        self.address = f"{options.host}:{self.served.port}"

    def info(self) -> dict:
        st = self.loop.status()
        d = self.engine.drafter
        drafter = {"drafter_state": d.state, "drafter_address": d.address, "drafter_reconnects": d.num_reconnects,
                   "drafter_failures": d.num_failures, "drafter_batches": d.num_batches,
                   "drafter_round_trip_s": d.round_trip_s, "drafter_compute_s": d.compute_s,
                   } if d is not None else {"drafter_state": "none"}
        return {"role": "target", "address": self.address, "running": st.num_running, "waiting": st.num_waiting,
                "steps": st.num_steps, **drafter, **_where()}

    def stop(self) -> None:
        self.served.stop(1.0)
        self.loop.stop()
        if self.engine.drafter is not None:
            self.engine.drafter.close()
