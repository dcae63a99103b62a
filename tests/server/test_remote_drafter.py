"""RemoteDrafter against real in-process drafter servers (loopback gRPC): batching, failover on a
malformed or stalled drafter, reconnection, and the session service's frame validation."""

import time

import grpc
import pytest
import torch

from orchestrator.config import SamplingParams
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine import DraftRequest, Engine
from orchestrator.models import TargetRunner, eos_token_ids
from orchestrator.server import ServerOptions, start_server
from orchestrator.server.drafter_service import DrafterServicer
from orchestrator.server.remote_drafter import RemoteDrafter
from orchestrator.tracing import Tracer
from protocol import codec, inline
from protocol.pb import blocks_pb2, drafter_pb2_grpc
from protocol.pb import drafter_pb2 as pb

from prompts import GROUNDED, PROMPTS

PROMPTS3 = [GROUNDED, PROMPTS[4], PROMPTS[7]]
MAX_NEW = 40


@pytest.fixture(scope="module")
def target(smollm2):
    return TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)


@pytest.fixture(scope="module")
def reference(target, smollm2, smollm2_tokenizer):
    engine = Engine(target, smollm2_tokenizer, None, eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer))
    return [engine.generate(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True)).output_ids
            for p in PROMPTS3]


class Misbehaving(DrafterServicer):
    """A real drafter server that goes wrong on its `bad_call`-th propose batch (only that one)."""

    def __init__(self, how: str, bad_call: int = 3, vocab_size: int = 49152):
        super().__init__(NgramDrafter(), vocab_size)
        self.how, self.bad_call, self.calls = how, bad_call, 0

    def _propose(self, r, seqs, where):
        out = super()._propose(r, seqs, where)
        if where.endswith("[0]"):
            self.calls += 1
        if self.calls != self.bad_call:
            return out
        if self.how == "out_of_vocab":
            out.draft_ids[:] = [10**6]
        elif self.how == "too_many":
            out.draft_ids[:] = [1] * (r.num_draft + 1)
        elif self.how == "stall" and where.endswith("[0]"):  # once per batch: a 1.5 s stall
            time.sleep(1.5)
        elif self.how == "bad_probs":
            out.draft_ids[:] = [1]
            enc = codec.encode(torch.full((1, self.vocab_size), 1.0 / self.vocab_size),
                               kind=blocks_pb2.TENSOR_KIND_DRAFT_PROBS, layout=blocks_pb2.LAYOUT_TOKENS_VOCAB)
            block = inline.to_block(enc)
            block.data = block.data[:-1] + bytes([block.data[-1] ^ 0xFF])  # the checksum no longer matches
            out.draft_probs.CopyFrom(block)
        return out


def serve(servicer):
    return start_server(ServerOptions(port=0), [servicer.register])


def run(engine, tokenizer, params):
    ids = [engine.add_request(tokenizer(p).input_ids, params) for p in PROMPTS3]
    while engine.has_work():
        engine.step()
    return [engine.release(i) for i in ids]


def time_proposals(drafter) -> list[float]:
    """Records how long each of the engine's propose_batch calls held up its step."""
    times, propose_batch = [], drafter.propose_batch

    def timed(requests):
        t0 = time.perf_counter()
        try:
            return propose_batch(requests)
        finally:
            times.append(time.perf_counter() - t0)

    drafter.propose_batch = timed
    return times


def make_engine(target, tokenizer, ckpt, drafter):
    return Engine(target, tokenizer, drafter, num_speculative_tokens=4,
                  eos_token_ids=eos_token_ids(ckpt, tokenizer))


def test_remote_ngram_is_lossless_and_sends_one_propose_frame_per_step(target, smollm2, smollm2_tokenizer, reference):
    served = serve(DrafterServicer(NgramDrafter(), vocab_size=target.vocab_size))
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size)
    try:
        engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference
        assert sum(s.stats.num_accepted for s in seqs) > 0
        assert all(s.stats.num_fallback_steps == 0 for s in seqs)
        # batched: at most one propose round trip per engine step, for all sequences together
        assert 0 < drafter.num_batches <= engine.num_steps
        assert drafter.compute_s < drafter.round_trip_s
        assert target.pool.num_free_blocks == target.pool.num_blocks
    finally:
        drafter.close()
        served.stop(0)


class Untimed(NgramDrafter):
    last_catch_up = None  # a drafter that cannot tell its catch-ups from its drafts


def test_the_drafters_catch_up_time_comes_back_with_its_proposals(target, smollm2_tokenizer, onnx_drafter):
    """The engine's cost model prices catch-ups apart from drafts; a remote drafter's come over the wire
    (nothing where the drafter cannot tell, so the engine fits them together)."""
    ids = smollm2_tokenizer(PROMPTS3[1]).input_ids
    for inner, timed in ((onnx_drafter, True), (Untimed(), False)):
        served = serve(DrafterServicer(inner, vocab_size=target.vocab_size))
        drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size)
        try:
            drafter.start(0, ids)
            assert drafter.propose_batch([DraftRequest(0, 3)])[0].draft_ids
            if timed:  # the prompt but its last token, within the drafter's own time
                assert drafter.last_catch_up.tokens == len(ids) - 1
                assert 0 < drafter.last_catch_up.seconds < drafter.compute_s
                drafter.extend(0, [13])
                drafter.propose_batch([DraftRequest(0, 3)])
                assert drafter.last_catch_up == (0.0, 0)
            else:
                assert drafter.last_catch_up is None
        finally:
            drafter.close()
            served.stop(0)


def test_overlapped_drafting_over_the_wire_is_lossless_and_records_wire_spans(
        target, smollm2, smollm2_tokenizer, reference, onnx_drafter):
    """A remote ONNX self-drafter drafting ahead on the engine's worker thread while the target
    verifies: greedy output unchanged, pre-drafts used, every round trip's wire time a span."""
    served = serve(DrafterServicer(onnx_drafter, vocab_size=target.vocab_size))
    tracer = Tracer()
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size, tracer=tracer)
    try:
        engine = Engine(target, smollm2_tokenizer, drafter, num_speculative_tokens=3, tracer=tracer,
                        eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer), overlap=True)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference
        assert sum(s.stats.steps_predrafted for s in seqs) == engine.overlap.stats.hits > 0
        assert drafter.num_failures == 0
        wire = [sp for sp in tracer.spans if sp.name == "wire"]
        assert len(wire) == drafter.num_batches and all(
            0 <= sp.dur_ms <= sp.args["round_trip_ms"] and sp.track.role == "wire" for sp in wire)
        ahead = [sp for sp in tracer.spans if sp.name == "draft" and sp.args.get("ahead")]
        assert ahead and all(sp.track == engine._drafter_track for sp in ahead)
        # the pre-drafts' round trips are marked; the rest is the wire the engine waited for
        assert sum(sp.args["ahead"] for sp in wire) == len(ahead)
        assert drafter.critical_wire_s * 1e3 == pytest.approx(sum(sp.dur_ms for sp in wire if not sp.args["ahead"]))
    finally:
        drafter.close()
        served.stop(0)


def test_a_stalled_drafter_while_drafting_ahead_fails_over_and_resumes(target, smollm2, smollm2_tokenizer, reference):
    servicer = Misbehaving("stall", vocab_size=target.vocab_size)
    served = serve(servicer)
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", timeout_s=0.5, vocab_size=target.vocab_size,
                            backoff_s=(0.05, 0.1))
    try:
        engine = Engine(target, smollm2_tokenizer, drafter, num_speculative_tokens=4,
                        eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer), overlap=True)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference
        assert drafter.num_failures >= 1 and drafter.num_reconnects >= 1, drafter.last_error
        assert drafter.state == "connected" and servicer.calls > servicer.bad_call  # speculation resumed
        assert target.pool.num_free_blocks == target.pool.num_blocks
    finally:
        drafter.close()
        served.stop(0)


@pytest.mark.parametrize("how", ["out_of_vocab", "too_many", "stall"])
def test_a_malformed_or_stalled_drafter_is_dropped_and_greedy_output_is_unchanged(
        how, target, smollm2, smollm2_tokenizer, reference):
    servicer = Misbehaving(how, vocab_size=target.vocab_size)
    served = serve(servicer)
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", timeout_s=0.5, vocab_size=target.vocab_size,
                            backoff_s=(0.05, 0.1))
    try:
        engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
        waits = time_proposals(drafter)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference
        # a stalled drafter is still busy when the first reconnects come: their probes time out in
        # the background, so the stall holds up one engine step only (the one that detected it) and
        # the drafter's 1.5 s stall ends while the engine keeps going: speculation resumes
        assert (drafter.num_failures == 1 or how == "stall" and drafter.num_failures >= 1) and \
            drafter.num_reconnects >= 1, drafter.last_error
        assert sum(t > 0.4 for t in waits) == (1 if how == "stall" else 0), sorted(waits)[-5:]
        assert all(s.stats.num_fallback_steps >= 1 for s in seqs)
        assert drafter.state == "connected" and servicer.calls > servicer.bad_call  # speculation resumed
        assert target.pool.num_free_blocks == target.pool.num_blocks
    finally:
        drafter.close()
        served.stop(0)


def test_a_corrupt_probability_block_drops_the_drafter_while_sampling(target, smollm2, smollm2_tokenizer):
    served = serve(Misbehaving("bad_probs", bad_call=1, vocab_size=target.vocab_size))
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size, backoff_s=(0.05, 0.1))
    try:
        engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=16, temperature=0.8, seed=3))
        assert drafter.num_failures == 1 and "checksum" in drafter.last_error
        assert all(s.output_ids for s in seqs)
    finally:
        drafter.close()
        served.stop(0)


def test_an_unreachable_drafter_leaves_the_engine_target_only(target, smollm2, smollm2_tokenizer, reference):
    from servers import free_port

    drafter = RemoteDrafter(f"127.0.0.1:{free_port()}", timeout_s=0.3, vocab_size=target.vocab_size)
    try:
        engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference and drafter.state == "unavailable"
        assert all(s.stats.num_drafted == 0 and s.stats.num_fallback_steps > 0 for s in seqs)
    finally:
        drafter.close()


def frame(**body):
    return pb.DrafterRequest(protocol_version=blocks_pb2.PROTOCOL_VERSION_1, request_id=1, **body)


BAD_SESSIONS = [
    ([pb.DrafterRequest(request_id=1, open=pb.OpenSequence(sequence_id=1, prompt_ids=[1]))], "protocol_version"),
    ([frame()], "body: empty frame"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2], kv_blocks=[blocks_pb2.Block()]))],
     "open.kv_blocks: this drafter does not take KV blocks"),
    ([frame(open=pb.OpenSequence(sequence_id=1))], "open.prompt_ids: needs 1.."),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 10**6]))], "open.prompt_ids: token ids"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1])),
      frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1]))], "open.sequence_id: 1 is already open"),
    ([frame(propose=pb.ProposeBatch(requests=[pb.DraftRequest(sequence_id=7, num_draft=2)]))],
     "propose.requests[0].sequence_id: 7 is not open"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2, 1])),
      frame(propose=pb.ProposeBatch(requests=[pb.DraftRequest(sequence_id=1, num_draft=99)]))],
     "propose.requests[0].num_draft"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2, 1])),
      frame(propose=pb.ProposeBatch(requests=[pb.DraftRequest(sequence_id=1, num_draft=2, temperature=-1)]))],
     "propose.requests[0].temperature"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2])),
      frame(verify=pb.VerifyBatch(results=[pb.VerifyResult(sequence_id=1, num_accepted=3, rollback_to=2)]))],
     "verify.results[0].num_accepted"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2])),
      frame(verify=pb.VerifyBatch(results=[pb.VerifyResult(sequence_id=1, rollback_to=9)]))],
     "verify.results[0].rollback_to"),
    ([frame(open=pb.OpenSequence(sequence_id=1, prompt_ids=[1, 2])),
      frame(verify=pb.VerifyBatch(results=[pb.VerifyResult(sequence_id=1, rollback_to=2,
                                                           hidden_states=blocks_pb2.Block())]))],
     "verify.results[0].hidden_states: this drafter does not read hidden states"),
]


@pytest.mark.parametrize("frames,message", BAD_SESSIONS)
def test_the_drafter_service_rejects_malformed_frames_naming_the_field(frames, message):
    ngram = NgramDrafter()
    served = serve(DrafterServicer(ngram, vocab_size=1000))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as ch:
            with pytest.raises(grpc.RpcError) as e:
                list(drafter_pb2_grpc.DrafterStub(ch).Session(iter(frames), timeout=10))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details(), e.value.details()
        time.sleep(0.1)
        assert ngram._tokens == {}  # the broken session's sequences are freed
    finally:
        served.stop(0)


def test_a_session_answers_in_order_and_rolls_back():
    served = serve(DrafterServicer(NgramDrafter(), vocab_size=1000))
    try:
        frames = [frame(open=pb.OpenSequence(sequence_id=5, prompt_ids=[1, 2, 3, 1, 2])),
                  frame(propose=pb.ProposeBatch(requests=[pb.DraftRequest(sequence_id=5, num_draft=2)])),
                  frame(verify=pb.VerifyBatch(results=[pb.VerifyResult(sequence_id=5, num_accepted=2,
                                                                        bonus_token_id=9, rollback_to=5)])),
                  frame(verify=pb.VerifyBatch(results=[pb.VerifyResult(sequence_id=5, rollback_to=6)])),
                  frame(close=pb.CloseSequence(sequence_id=5))]
        for i, f in enumerate(frames):
            f.request_id = i + 1
        with grpc.insecure_channel(f"127.0.0.1:{served.port}") as ch:
            answers = list(drafter_pb2_grpc.DrafterStub(ch).Session(iter(frames), timeout=10))
        assert [a.request_id for a in answers] == [1, 2, 3, 4, 5]
        assert answers[0].ack.num_tokens == 5
        assert list(answers[1].proposals.proposals[0].draft_ids) == [3, 1]  # the n-gram continuation of "1 2"
    finally:
        served.stop(0)



def test_kv_handoff_to_a_remote_self_drafter_opens_from_the_targets_kv(
        target, smollm2, smollm2_tokenizer, reference, onnx_drafter):
    servicer = DrafterServicer(onnx_drafter, vocab_size=target.vocab_size, model_id=target.model_id)
    served = serve(servicer)
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size, kv_source=target)
    try:
        engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference
        assert servicer.num_kv_opens == len(PROMPTS3) and drafter.num_failures == 0
        assert sum(s.stats.num_accepted for s in seqs) > 0
        # K/V from another model, or covering the whole prompt, are refused naming the field
        d = onnx_drafter
        for model_id, tokens, message in (("other", 4, "model_id"), (target.model_id, 8, "open.kv_blocks[0].tokens")):
            kv = torch.zeros(d.num_layers, 2, 1, 16, d.num_kv_heads, d.head_dim)
            block = inline.to_block(codec.encode(
                kv, kind=blocks_pb2.TENSOR_KIND_KV, layout=blocks_pb2.LAYOUT_KV_POOL, model_id=model_id,
                layers=(0, d.num_layers), heads=(0, d.num_kv_heads), tokens=(0, tokens), block_size=16))
            with grpc.insecure_channel(f"127.0.0.1:{served.port}") as ch:
                with pytest.raises(grpc.RpcError) as e:
                    list(drafter_pb2_grpc.DrafterStub(ch).Session(iter([frame(open=pb.OpenSequence(
                        sequence_id=1, prompt_ids=list(range(8)), kv_blocks=[block]))]), timeout=10))
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in e.value.details(), e.value.details()
    finally:
        drafter.close()
        served.stop(0)


def test_a_drafter_that_refuses_kv_blocks_is_opened_from_tokens_instead(target, smollm2, smollm2_tokenizer, reference):
    served = serve(DrafterServicer(NgramDrafter(), vocab_size=target.vocab_size, model_id=target.model_id))
    drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size, kv_source=target,
                            backoff_s=(0.05, 0.1))
    assert drafter.opens_caught_up  # until the drafter refuses the K/V: then its cost model charges the prompt
    try:
        engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
        seqs = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
        assert [s.output_ids for s in seqs] == reference
        assert drafter.num_failures == 1 and "open.kv_blocks" in drafter.last_error and drafter.kv_source is None
        assert not drafter.opens_caught_up
        assert drafter.state == "connected" and sum(s.stats.num_accepted for s in seqs) > 0
    finally:
        drafter.close()
        served.stop(0)


def test_shared_memory_transport_carries_kv_and_probabilities_with_the_same_output(
        target, smollm2, smollm2_tokenizer, reference, onnx_drafter):
    """transport.kind on both sides: K/V to the drafter and q back through segments, not messages;
    greedy output stays the target's, and seeded sampled output equals the inline run's."""
    outputs = {}
    for kind in ("inline", "shared_memory"):
        servicer = DrafterServicer(onnx_drafter, vocab_size=target.vocab_size, model_id=target.model_id,
                                   transport=kind)
        served = serve(servicer)
        drafter = RemoteDrafter(f"127.0.0.1:{served.port}", vocab_size=target.vocab_size, kv_source=target,
                                transport=kind)
        try:
            engine = make_engine(target, smollm2_tokenizer, smollm2, drafter)
            greedy = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=MAX_NEW, ignore_eos=True))
            assert [s.output_ids for s in greedy] == reference
            sampled = run(engine, smollm2_tokenizer, SamplingParams(max_new_tokens=24, temperature=0.8, seed=5,
                                                                   ignore_eos=True))
            outputs[kind] = [s.output_ids for s in sampled]
            assert drafter.num_failures == 0 and servicer.num_kv_opens == 2 * len(PROMPTS3)
            shm = kind == "shared_memory"
            assert servicer.blocks_in.num_shm_blocks == (2 * len(PROMPTS3) if shm else 0)
            assert drafter.blocks_in.num_blocks > 0  # probability blocks came back while sampling
            assert drafter.blocks_in.num_shm_blocks == (drafter.blocks_in.num_blocks if shm else 0)
        finally:
            drafter.close()
            served.stop(0)
    assert outputs["shared_memory"] == outputs["inline"]
