"""KV blocks for real: swap a sequence's KV to host and back, and hand the target's prefill KV
to a self-drafter. Real SmolLM2-135M target and its INT4 ONNX export."""

import pytest
import torch

from orchestrator.build import build_drafter, eos_token_ids
from orchestrator.config import EngineConfig, SamplingParams
from orchestrator.drafters.handoff import KvHandoffDrafter
from orchestrator.engine import Engine
from orchestrator.kv_transfer import export_kv, swap_in, swap_out
from orchestrator.target import TargetRunner
from protocol import codec, inline
from protocol.errors import BlockError
from protocol.pb import blocks_pb2 as pb
from protocol.staging import StagingPool
from prompts import GROUNDED, PROMPTS


@pytest.fixture(scope="module")
def target(smollm2):
    return TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)


@pytest.fixture(scope="module")
def drafter(smollm2):
    d = build_drafter(EngineConfig(), smollm2, progress=False)  # the default INT4 export (cached)
    yield d
    d.close()


def _engine(target, tokenizer, ckpt, drafter=None):
    return Engine(target, tokenizer, drafter, num_speculative_tokens=4, eos_token_ids=eos_token_ids(ckpt, tokenizer))


def _run(engine, ids, params, swap_at=None, staging=None):
    """Generate, optionally swapping the sequence's KV out to host and back after `swap_at` steps."""
    seq_id = engine.add_request(ids, params)
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
        if steps == swap_at:
            before = engine.target.pool.read_blocks(seq_id)
            host = swap_out(engine.target, seq_id, staging)
            assert engine.target.pool.num_free_blocks == engine.target.pool.num_blocks  # really out
            swap_in(engine.target, seq_id, host)
            assert torch.equal(engine.target.pool.read_blocks(seq_id), before)
    return engine.release(seq_id).output_ids


def test_swap_out_and_in_gives_identical_tokens(target, smollm2, smollm2_tokenizer):
    engine = _engine(target, smollm2_tokenizer, smollm2)
    ids = smollm2_tokenizer(PROMPTS[0]).input_ids
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    staging = StagingPool(target.device)
    expected = _run(engine, ids, params)
    assert _run(engine, ids, params, swap_at=5, staging=staging) == expected
    assert _run(engine, ids, params, swap_at=11, staging=staging) == expected
    assert staging.free_bytes > 0  # swapped-in buffers went back to the pool for reuse
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_swap_in_rejects_a_corrupt_or_foreign_block(target, smollm2, smollm2_tokenizer):
    seq_id = 10_000
    target.forward([(seq_id, smollm2_tokenizer(PROMPTS[1]).input_ids, 1)])
    staging = StagingPool(target.device)
    host = swap_out(target, seq_id, staging)
    free = target.pool.num_free_blocks
    cases = {
        "checksum": lambda d: setattr(d, "checksum", d.checksum ^ 1),
        "model_id": lambda d: setattr(d, "model_id", "another-model"),
        "layers": lambda d: setattr(d.layers, "end", 29),
    }
    for field, damage in cases.items():
        saved = pb.BlockDescriptor()
        saved.CopyFrom(host.encoded.descriptor)
        damage(host.encoded.descriptor)
        with pytest.raises(BlockError) as e:
            swap_in(target, seq_id, host)
        assert e.value.field == field
        assert target.pool.num_free_blocks == free and seq_id not in target.pool.tables  # untouched
        host.encoded.descriptor.CopyFrom(saved)
    swap_in(target, seq_id, host)
    target.free(seq_id)


def test_handed_off_kv_is_the_targets_and_output_stays_lossless(target, drafter, smollm2, smollm2_tokenizer):
    ids = smollm2_tokenizer(GROUNDED).input_ids  # a few hundred tokens
    params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    expected = _engine(target, smollm2_tokenizer, smollm2).generate(ids, params).output_ids
    handoff = KvHandoffDrafter(drafter, target)
    engine = _engine(target, smollm2_tokenizer, smollm2, handoff)
    seq = engine.generate(ids, params)
    assert seq.output_ids == expected
    assert seq.stats.num_drafted > 0 and seq.stats.num_accepted > 0
    s = target.model.spec
    assert handoff.bytes_sent >= s.num_layers * 2 * s.num_kv_heads * len(ids) * s.head_dim * 4


def test_drafter_started_from_kv_holds_exactly_the_targets_kv(target, drafter, smollm2_tokenizer):
    seq_id = 20_000
    ids = smollm2_tokenizer(PROMPTS[2]).input_ids
    target.forward([(seq_id, ids, 1)])
    handoff = KvHandoffDrafter(drafter, target)
    handoff.start(seq_id, ids)
    host = export_kv(target, seq_id, StagingPool(target.device))
    want = codec.pool_to_seq(codec.decode(host.encoded.descriptor, host.encoded.payload), len(ids))  # [L, 2, H, T, D]
    host.release()
    kv = drafter._seqs[seq_id].cache  # [2 * layers] buffers [1, H, capacity, D], layer-major, key first
    got = torch.stack([torch.from_numpy(kv.host[i][0, :, :len(ids)]) for i in range(len(kv.host))])
    assert torch.equal(got.view(want.shape[0], 2, *got.shape[1:]), want)
    assert drafter.cached_length(seq_id) == len(ids)
    handoff.finish(seq_id)
    target.free(seq_id)


def test_kv_seq_block_from_another_drafter_state_reproduces_its_drafts(drafter, smollm2_tokenizer):
    """Mechanics: the drafter's own K/V, sent as a KV_SEQ block, gives the same drafts as its prefill."""
    ids = smollm2_tokenizer(PROMPTS[3]).input_ids
    drafter.start(1, ids)
    first = drafter.propose(1, 4).draft_ids
    kv = drafter._seqs[1].cache
    T = len(ids) - 1  # the last prompt token is run by propose, its K/V is past the handoff
    own = torch.stack([torch.from_numpy(kv.host[i][0, :, :T]) for i in range(len(kv.host))])
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


def test_staging_pool_reuses_buffers_and_round_trips():
    pool = StagingPool("cpu", max_bytes=1 << 20)
    x = torch.randn(64, 64)
    staged = pool.to_host(x)
    assert torch.equal(staged.wait(), x)
    staged.release()
    again = pool.to_host(x * 2)
    assert pool.num_reuses == 1 and torch.equal(again.wait(), x * 2)
    again.release()
    big = pool.acquire(2 << 20)  # above max_bytes: lent, not kept
    pool.release(big)
    assert pool.free_bytes <= pool.max_bytes


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU for pinned staging")
def test_cuda_staging_is_pinned_and_async():
    pool = StagingPool("cuda:0")
    x = torch.randn(1024, 1024, device="cuda:0")
    staged = pool.to_host(x)
    assert staged.host.is_pinned()
    assert torch.equal(staged.wait(), x.cpu())
    back = pool.to_device(staged.host, "cuda:0")
    assert torch.equal(back, x)
    staged.release()


def test_handoff_records_its_transfer_spans_and_phases_still_add_up(target, drafter, smollm2, smollm2_tokenizer):
    import time

    engine = _engine(target, smollm2_tokenizer, smollm2, KvHandoffDrafter(drafter, target))
    engine.tracer.enabled = True
    ids = smollm2_tokenizer(GROUNDED).input_ids
    t0 = time.perf_counter()
    engine.generate(ids, SamplingParams(max_new_tokens=16, ignore_eos=True))
    wall_ms = (time.perf_counter() - t0) * 1e3
    spans = engine.tracer.clear()
    by_name = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    for phase in ("d2h", "serialize", "deserialize", "h2d"):  # once, at the drafter's start
        assert len(by_name[phase]) == 1, phase
    (ser,), (des,) = by_name["serialize"], by_name["deserialize"]
    assert ser.flow_out is not None and des.flow_in == (ser.flow_out,)
    assert ser.args["nbytes"] == engine.drafter.bytes_sent
    assert by_name["h2d"][0].track == engine._drafter_track  # the engine's own timeline for the drafter
    covered = sum(s.dur_ms for s in spans)
    assert 0.9 * wall_ms <= covered <= 1.02 * wall_ms  # no phase counted twice, little left out
