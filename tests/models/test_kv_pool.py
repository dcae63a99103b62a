import pytest
import torch

from orchestrator.models import BlockPool, PoolExhausted


def make_pool(num_blocks=4, block_size=4):
    return BlockPool(num_layers=2, num_kv_heads=1, head_dim=2, num_blocks=num_blocks,
                     block_size=block_size, dtype=torch.float32)


def test_grow_allocates_whole_blocks_and_free_returns_them():
    pool = make_pool()
    pool.grow(7, 5)
    assert len(pool.tables[7]) == 2 and pool.num_free_blocks == 2
    pool.grow(7, 8)  # still fits in two blocks
    assert pool.num_free_blocks == 2
    pool.free(7)
    assert pool.num_free_blocks == 4 and 7 not in pool.tables


def test_truncate_frees_blocks_past_the_length():
    pool = make_pool()
    pool.grow(1, 12)
    pool.commit_length(1, 12)
    pool.truncate(1, 5)
    assert len(pool.tables[1]) == 2 and pool.num_free_blocks == 2 and pool.lengths[1] == 5
    pool.truncate(1, 0)
    assert pool.tables[1] == [] and pool.num_free_blocks == 4
    with pytest.raises(ValueError):
        pool.truncate(1, 3)


def test_exhaustion_raises_and_leaves_pool_unchanged():
    pool = make_pool()
    pool.grow(1, 12)
    with pytest.raises(PoolExhausted):
        pool.grow(2, 8)
    assert pool.num_free_blocks == 1 and 2 not in pool.tables


def test_slots_address_the_block_table_and_roundtrip_values():
    pool = make_pool()
    pool.grow(1, 4)
    pool.grow(2, 4)
    pool.grow(1, 6)  # sequence 1's second block comes after sequence 2's
    slots = pool.slots(1, 0, 6)
    t = pool.tables[1]
    assert slots.tolist() == [t[0] * 4 + i for i in range(4)] + [t[1] * 4, t[1] * 4 + 1]
    k = torch.arange(12, dtype=torch.float32).view(6, 1, 2)
    pool.write(1, slots, k, -k)
    keys, values = pool.gather(1, slots)
    assert torch.equal(keys, k) and torch.equal(values, -k)
    assert pool.kv[0].abs().sum() == 0  # layer 0 untouched
