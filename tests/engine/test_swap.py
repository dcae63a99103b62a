"""Swapping a sequence's K/V out of the pool to host memory and back, as a protocol block.
Real SmolLM2-135M target."""

import pytest
import torch

from orchestrator.config import SamplingParams
from orchestrator.engine import Engine
from orchestrator.engine.swap import swap_in, swap_out
from orchestrator.models import TargetRunner, eos_token_ids
from protocol import BlockError, StagingPool
from protocol.pb import blocks_pb2 as pb

from prompts import PROMPTS


@pytest.fixture(scope="module")
def target(smollm2):
    return TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)


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
