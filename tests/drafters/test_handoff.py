"""KV handoff for real: the target's prefill K/V as one block to its INT4 ONNX self-drafter
(SmolLM2-135M), inline or through shared memory, with its transfer spans."""

import pytest
import torch

from orchestrator.assemble import build_drafter, drafter_context
from orchestrator.config import EngineConfig, SamplingParams
from orchestrator.drafters import KvHandoffDrafter
from orchestrator.engine import DraftRequest, Engine, Status
from orchestrator.engine.swap import export_kv
from orchestrator.models import TargetRunner, eos_token_ids
from orchestrator.tracing import Tracer
from protocol import StagingPool, codec, inline
from protocol.pb import blocks_pb2 as pb

from prompts import GROUNDED, PROMPTS


@pytest.fixture(scope="module")
def target(smollm2):
    return TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)


@pytest.fixture(scope="module")
def drafter(smollm2):
    config = EngineConfig()  # the default INT4 export (cached)
    d = build_drafter(config.drafter, drafter_context(config, smollm2, progress=False))
    yield d
    d.close()


def _engine(target, tokenizer, ckpt, drafter=None, tracer=None, overlap=False):
    return Engine(target, tokenizer, drafter, num_speculative_tokens=4, eos_token_ids=eos_token_ids(ckpt, tokenizer),
                  tracer=tracer, overlap=overlap)


@pytest.mark.parametrize("overlap", [False, True])
def test_handed_off_kv_is_the_targets_and_output_stays_lossless(target, drafter, smollm2, smollm2_tokenizer, overlap):
    """Also with the next step drafted ahead while the target verifies (`overlap`)."""
    ids = smollm2_tokenizer(GROUNDED).input_ids  # a few hundred tokens
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    expected = _engine(target, smollm2_tokenizer, smollm2).generate(ids, params).output_ids
    handoff = KvHandoffDrafter(drafter, target)
    engine = _engine(target, smollm2_tokenizer, smollm2, handoff, overlap=overlap)
    seq = engine.generate(ids, params)
    assert seq.output_ids == expected
    assert seq.stats.num_drafted > 0 and seq.stats.num_accepted > 0
    assert (seq.stats.steps_predrafted > 0) == overlap
    s = target.model.spec
    assert handoff.bytes_sent >= s.num_layers * 2 * s.num_kv_heads * len(ids) * s.head_dim * 4


def test_shared_memory_transport_carries_the_kv_and_keeps_output_lossless(target, drafter, smollm2,
                                                                          smollm2_tokenizer):
    """transport.kind: shared_memory: the block's bytes go through a segment, not the message."""
    import os

    from protocol.shm import live_segments

    ids = smollm2_tokenizer(PROMPTS[5]).input_ids
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    expected = _engine(target, smollm2_tokenizer, smollm2).generate(ids, params).output_ids
    before = set(live_segments(os.getpid()))
    handoff = KvHandoffDrafter(drafter, target, transport="shared_memory")
    sent = []
    pack = handoff.packer.pack
    handoff.packer.pack = lambda enc: sent.append(pack(enc)) or sent[-1]  # observe the Block message
    seq = _engine(target, smollm2_tokenizer, smollm2, handoff).generate(ids, params)
    assert seq.output_ids == expected and seq.stats.num_accepted > 0
    (block,) = sent
    assert block.descriptor.locator.WhichOneof("where") == "shm" and block.data == b""
    assert handoff.bytes_sent == block.descriptor.byte_length > 0
    assert set(live_segments(os.getpid())) - before  # the writer's segment, until it closes
    handoff.packer.close()
    assert set(live_segments(os.getpid())) == before


def test_drafter_started_from_kv_holds_exactly_the_targets_kv(target, drafter, smollm2_tokenizer):
    seq_id = 20_000
    ids = smollm2_tokenizer(PROMPTS[2]).input_ids
    target.forward([(seq_id, ids, 1)])
    handoff = KvHandoffDrafter(drafter, target)
    handoff.start(seq_id, ids)
    assert handoff.bytes_sent == 0  # nothing moves before the first draft
    handoff.hand_off([seq_id])  # what its first draft does
    host = export_kv(target, seq_id, StagingPool(target.device))
    want = codec.pool_to_seq(codec.decode(host.encoded.descriptor, host.encoded.payload), len(ids))  # [L, 2, H, T, D]
    host.release()
    # [2 * layers] arrays [H, capacity, D], layer-major, key first
    got = torch.stack([torch.from_numpy(a[:, :len(ids)]) for a in drafter.host_kv(seq_id)])
    assert torch.equal(got.view(want.shape[0], 2, *got.shape[1:]), want)
    assert drafter.cached_length(seq_id) == len(ids)
    handoff.finish(seq_id)
    target.free(seq_id)


@pytest.mark.parametrize("kv_handoff, model, wrapped", [
    ("auto", None, True),  # the default: the target's own export, the target in this process
    (False, None, False),
    ("auto", "smollm2-135m", False),  # a drafter model: not known to share the target's K/V
])
def test_kv_handoff_auto_is_on_for_a_self_drafter_only(target, smollm2, kv_handoff, model, wrapped):
    from dataclasses import replace

    config = EngineConfig()
    assert config.drafter.kv_handoff == "auto"
    built = build_drafter(replace(config.drafter, kv_handoff=kv_handoff, model=model),
                          drafter_context(config, smollm2, target=target, progress=False))
    try:
        assert isinstance(built, KvHandoffDrafter) == wrapped
    finally:
        built.close()
    served = build_drafter(config.drafter, drafter_context(config, smollm2, progress=False))  # no target here
    assert not isinstance(served, KvHandoffDrafter)
    served.close()


def test_cost_model_charges_a_handed_off_drafter_no_prompt_catch_up(target, drafter, smollm2, smollm2_tokenizer):
    """Before its first draft a sequence's drafter lags by every committed token, less the prompt where
    the prompt's K/V was handed over: what the cost model charges the first draft; the hand-off itself
    is charged apart, at what hand-offs took per token."""
    ids = smollm2_tokenizer(GROUNDED).input_ids
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    for wrapped, lag in ((False, len(ids) + 1), (True, 1)):
        engine = _engine(target, smollm2_tokenizer, smollm2, KvHandoffDrafter(drafter, target) if wrapped else drafter)
        seq_id = engine.add_request(ids, params)
        engine.step()  # the prefill commits the first token
        seq = engine.sequences[seq_id]
        assert engine.drafter.opens_caught_up == wrapped and not seq.acceptance.drafted
        assert engine._drafter_lag(seq) == lag
        assert engine._opening(seq) == (len(ids) if wrapped else 0)  # charged as a hand-off instead
        while engine.has_work():
            engine.step()
        engine.release(seq_id)
        timed = engine.policy.cost._opening  # the hand-off was timed: [seconds, tokens]
        assert (timed is not None and timed[0] > 0 and timed[1] == len(ids)) == wrapped


def test_a_sequence_that_never_drafts_moves_no_kv_and_a_late_one_catches_up_on_nothing(
        target, drafter, smollm2, smollm2_tokenizer):
    """The hand-off waits for a sequence's first draft; then it carries the K/V of every committed token
    the target has run (the prompt and the steps decoded without drafts): the drafter has nothing to
    catch up, and the output stays target-only's."""
    ids = smollm2_tokenizer(PROMPTS[1]).input_ids
    short, params = SamplingParams(max_new_tokens=6, ignore_eos=True), SamplingParams(max_new_tokens=24, ignore_eos=True)
    expected = _engine(target, smollm2_tokenizer, smollm2).generate(ids, params).output_ids
    handoff = KvHandoffDrafter(drafter, target)
    # vLLM's rule: no drafts while 2 sequences run; the short one never drafts, the other starts late
    engine = Engine(target, smollm2_tokenizer, handoff, num_speculative_tokens=4, disable_by_batch_size=2,
                    eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer))
    other, seq_id = engine.add_request(smollm2_tokenizer(PROMPTS[2]).input_ids, short), engine.add_request(ids, params)
    seq = engine.sequences[seq_id]
    while engine.sequences[other].status != Status.FINISHED:
        engine.step()
    assert handoff.bytes_sent == 0 and seq.stats.num_drafted == 0 and seq.num_tokens > len(ids) + 2
    committed = seq.num_tokens
    engine.step()
    assert seq.stats.num_drafted > 0 and drafter.last_catch_up.tokens == 0  # its first draft ran the newest token only
    s = target.model.spec
    per_token = s.num_layers * 2 * s.num_kv_heads * s.head_dim * 4
    assert per_token * (committed - 1) <= handoff.bytes_sent < per_token * (committed - 1 + 16)  # whole pool blocks
    while engine.has_work():
        engine.step()
    engine.release(other)
    out = engine.release(seq_id)
    assert out.output_ids == expected


def test_handed_off_drafter_drafts_a_batch_in_one_run_per_draft_position(target, drafter, smollm2_tokenizer):
    """The wrapper keeps the drafter's batched drafting (and the cost model's prior that says so):
    one ONNX Runtime run per draft position for all sequences, the same drafts as one by one."""
    prompts = [smollm2_tokenizer(p).input_ids for p in PROMPTS[:3]]
    ids = [21_000 + i for i in range(3)]
    target.forward([(s + off, p, 1) for s, p in zip(ids, prompts) for off in (0, 100)])  # 100 on: drafted alone
    handoff = KvHandoffDrafter(drafter, target)
    for s, p in zip(ids, prompts):
        handoff.start(s, p)
        handoff.start(s + 100, p)
    handoff.hand_off(ids)  # the hand-off's own runs are not counted below
    rows = []
    run_batch = drafter._run_batch
    drafter._run_batch = lambda items: rows.append(len(items)) or run_batch(items)  # observe the runs
    try:
        batch = handoff.propose_batch([DraftRequest(s, 4) for s in ids])
    finally:
        del drafter._run_batch
    alone = {s: handoff.propose(s + 100, 4).draft_ids for s in ids}
    for s in ids:
        handoff.finish(s)
        handoff.finish(s + 100)
        target.free(s)
        target.free(s + 100)
    assert handoff.batched and drafter.batched
    assert rows == [3, 3, 3, 3]
    assert {s: p.draft_ids for s, p in batch.items()} == alone and all(len(d) == 4 for d in alone.values())


def test_kv_seq_block_from_another_drafter_state_reproduces_its_drafts(drafter, smollm2_tokenizer):
    """Mechanics: the drafter's own K/V, sent as a KV_SEQ block, gives the same drafts as its prefill."""
    ids = smollm2_tokenizer(PROMPTS[3]).input_ids
    drafter.start(1, ids)
    first = drafter.propose(1, 4).draft_ids
    T = len(ids) - 1  # the last prompt token is run by propose, its K/V is past the handoff
    own = torch.stack([torch.from_numpy(a[:, :T]) for a in drafter.host_kv(1)])
    own = own.view(drafter.num_layers, 2, *own.shape[1:])  # [L, 2, H, T, D]
    enc = codec.encode(own.half(), kind=pb.TENSOR_KIND_KV, layout=pb.LAYOUT_KV_SEQ,
                       layers=(0, drafter.num_layers), heads=(0, drafter.num_kv_heads), tokens=(0, T))
    d, payload = inline.from_block(inline.to_block(enc))
    drafter.start_with_kv(2, ids, codec.decode(d, payload, dtype=torch.float32))
    # fp16 on the wire rounds the K/V: the argmax chain may differ only where logits are near-tied
    second = drafter.propose(2, 4).draft_ids
    drafter.finish(1)
    drafter.finish(2)
    assert second[:2] == first[:2]


def test_handoff_rejects_kv_of_the_wrong_shape(drafter):
    with pytest.raises(Exception, match="this drafter needs"):
        drafter.start_with_kv(3, [1, 2, 3], torch.zeros(2, 2, 3, 3, 64))


def test_handoff_records_its_transfer_spans_and_phases_still_add_up(target, drafter, smollm2, smollm2_tokenizer):
    import time

    tracer = Tracer()
    engine = _engine(target, smollm2_tokenizer, smollm2, KvHandoffDrafter(drafter, target, tracer=tracer), tracer)
    ids = smollm2_tokenizer(GROUNDED).input_ids
    t0 = time.perf_counter()
    engine.generate(ids, SamplingParams(max_new_tokens=16, ignore_eos=True))
    wall_ms = (time.perf_counter() - t0) * 1e3
    spans = engine.tracer.clear()
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    transfer = ("d2h", "serialize", "deserialize", "h2d")
    (first_draft, *_) = by_name["draft"]
    for phase in transfer:  # once, just before the sequence's first draft, after its prefill
        assert len(by_name[phase]) == 1, phase
        span = by_name[phase][0]
        assert by_name["prefill"][0].start_ns < span.start_ns
        assert span.start_ns + span.dur_ms * 1e6 <= first_draft.start_ns
    (ser,), (des,) = by_name["serialize"], by_name["deserialize"]
    assert ser.flow_out is not None and des.flow_in == (ser.flow_out,)
    assert ser.args["nbytes"] == engine.drafter.bytes_sent
    assert by_name["h2d"][0].track == engine._drafter_track  # the engine's own timeline for the drafter
    covered = sum(s.dur_ms for s in spans)  # the transfers lie beside the draft spans, not inside
    assert 0.9 * wall_ms <= covered <= 1.02 * wall_ms  # no phase counted twice, little left out
