"""End to end on the real SmolLM2-135M: speculative output equals target-only output."""

import pytest

from orchestrator.config import SamplingParams
from orchestrator.drafters.ngram import NgramDrafter
from orchestrator.engine import Engine
from orchestrator.errors import InvalidRequestError
from orchestrator.models import TargetRunner, eos_token_ids

from prompts import GROUNDED, PROMPTS


@pytest.fixture(scope="module")
def target(smollm2):
    return TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)


def make_engine(target, tokenizer, ckpt, drafter=None, k=4, max_num_seqs=16, k_policy="fixed", preemption="auto"):
    return Engine(target, tokenizer, drafter, num_speculative_tokens=k, max_num_seqs=max_num_seqs,
                  eos_token_ids=eos_token_ids(ckpt, tokenizer), k_policy=k_policy, preemption=preemption)


@pytest.fixture(scope="module")
def reference(target, smollm2, smollm2_tokenizer):
    """Target-only greedy outputs, 128 new tokens each (EOS may end some earlier)."""
    engine = make_engine(target, smollm2_tokenizer, smollm2)
    prompts = PROMPTS[:10] + [GROUNDED]
    return {p: engine.generate(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True)).output_ids
            for p in prompts}


def test_ngram_greedy_is_lossless_and_pool_is_full_after(target, smollm2, smollm2_tokenizer, reference):
    engine = make_engine(target, smollm2_tokenizer, smollm2, NgramDrafter(), k=4)
    drafted = 0
    for prompt, expected in reference.items():
        seq = engine.generate(smollm2_tokenizer(prompt).input_ids,
                              SamplingParams(max_new_tokens=128, ignore_eos=True))
        assert len(expected) == 128 and seq.output_ids == expected, prompt
        assert target.pool.num_free_blocks == target.pool.num_blocks
        drafted += seq.stats.num_drafted
    assert drafted > 0  # speculation actually happened


def test_batched_requests_match_one_at_a_time(target, smollm2, smollm2_tokenizer, reference):
    engine = make_engine(target, smollm2_tokenizer, smollm2, NgramDrafter(), k=3)
    ids = {engine.add_request(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True)): p
           for p in list(reference)[:4]}
    while engine.has_work():
        engine.step()
    for seq_id, prompt in ids.items():
        assert engine.release(seq_id).output_ids == reference[prompt]
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_cancel_frees_blocks_and_new_requests_join_between_steps(target, smollm2, smollm2_tokenizer):
    engine = make_engine(target, smollm2_tokenizer, smollm2, NgramDrafter(), k=4)
    a = engine.add_request(smollm2_tokenizer(PROMPTS[9]).input_ids, SamplingParams(max_new_tokens=64, ignore_eos=True))
    engine.step()
    engine.step()
    b = engine.add_request(smollm2_tokenizer(PROMPTS[1]).input_ids, SamplingParams(max_new_tokens=8, ignore_eos=True))
    engine.step()
    assert engine.sequences[a].finish_reason is None and len(engine.sequences[b].output_ids) == 1
    held = len(target.pool.tables[a])
    free_before = target.pool.num_free_blocks
    engine.cancel(a)
    assert target.pool.num_free_blocks == free_before + held and a not in target.pool.tables
    assert engine.sequences[a].finish_reason == "cancelled"
    while engine.has_work():
        engine.step()
    assert len(engine.release(b).output_ids) == 8
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_stop_string_and_max_tokens(target, smollm2, smollm2_tokenizer, reference):
    engine = make_engine(target, smollm2_tokenizer, smollm2, NgramDrafter(), k=4)
    prompt = PROMPTS[3]
    full = smollm2_tokenizer.decode(reference[prompt], skip_special_tokens=True)
    stop = full.strip().split()[2]
    seq = engine.generate(smollm2_tokenizer(prompt).input_ids,
                          SamplingParams(max_new_tokens=128, stop=(stop,), ignore_eos=True))
    assert seq.finish_reason == "stop" and stop not in seq.text and full.startswith(seq.text)
    seq = engine.generate(smollm2_tokenizer(prompt).input_ids, SamplingParams(max_new_tokens=5, ignore_eos=True))
    assert seq.finish_reason == "length" and seq.output_ids == reference[prompt][:5]


def test_sampling_is_reproducible_with_a_seed(target, smollm2, smollm2_tokenizer):
    engine = make_engine(target, smollm2_tokenizer, smollm2, NgramDrafter(), k=4)
    ids = smollm2_tokenizer(GROUNDED).input_ids
    params = SamplingParams(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=7)
    a = engine.generate(ids, params).output_ids
    b = engine.generate(ids, params).output_ids
    c = engine.generate(ids, SamplingParams(max_new_tokens=32, temperature=0.8, top_p=0.95, seed=8)).output_ids
    assert a == b and a != c


@pytest.mark.parametrize("params, prompt, match", [
    (SamplingParams(), [], "empty"),
    (SamplingParams(), list(range(5000)), "context limit"),
    (SamplingParams(max_new_tokens=0), [1, 2], "max_new_tokens"),
    (SamplingParams(temperature=-0.5), [1, 2], "temperature"),
    (SamplingParams(top_p=1.5), [1, 2], "top_p"),
    (SamplingParams(temperature=float("nan")), [1, 2], "temperature"),
])
def test_bad_requests_are_rejected_clearly(target, smollm2, smollm2_tokenizer, params, prompt, match):
    engine = make_engine(target, smollm2_tokenizer, smollm2)
    with pytest.raises(InvalidRequestError, match=match):
        engine.add_request(prompt, params)
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_gemma3_ngram_greedy_is_lossless(gemma3):
    from orchestrator.models import load_tokenizer

    tok = load_tokenizer(gemma3)
    target = TargetRunner(gemma3, block_size=16, max_kv_tokens=2048)
    for prompt in (GROUNDED, PROMPTS[2], PROMPTS[9]):
        ids = tok(prompt).input_ids
        params = SamplingParams(max_new_tokens=48, ignore_eos=True)
        plain = make_engine(target, tok, gemma3).generate(ids, params)
        spec = make_engine(target, tok, gemma3, NgramDrafter(), k=4).generate(ids, params)
        assert len(plain.output_ids) == 48 and spec.output_ids == plain.output_ids, prompt
    assert target.pool.num_free_blocks == target.pool.num_blocks



def test_onnx_int4_greedy_is_lossless(target, smollm2, smollm2_tokenizer, reference, onnx_drafter):
    engine = make_engine(target, smollm2_tokenizer, smollm2, onnx_drafter, k=4)
    accepted = 0
    for prompt, expected in reference.items():
        seq = engine.generate(smollm2_tokenizer(prompt).input_ids,
                              SamplingParams(max_new_tokens=128, ignore_eos=True))
        assert seq.output_ids == expected, prompt
        accepted += seq.stats.num_accepted
        assert target.pool.num_free_blocks == target.pool.num_blocks
    assert accepted > 0  # the INT4 drafter's proposals were actually used


def test_auto_k_is_lossless_in_a_batch_while_k_changes(target, smollm2, smollm2_tokenizer, reference, onnx_drafter):
    """The cost model picks each sequence's k every step (0 included) for a batch of six: greedy
    output stays the target's, token for token."""
    engine = make_engine(target, smollm2_tokenizer, smollm2, onnx_drafter, k=8, k_policy="auto")
    prompts = list(reference)[:6]
    ids = {engine.add_request(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True)): p
           for p in prompts}
    while engine.has_work():
        engine.step()
    steps_per_k = {}
    for seq_id, prompt in ids.items():
        seq = engine.release(seq_id)
        assert seq.output_ids == reference[prompt], prompt
        for k, n in seq.stats.steps_per_k.items():
            steps_per_k[k] = steps_per_k.get(k, 0) + n
    assert len(steps_per_k) >= 2, steps_per_k  # k really varied
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_confident_drafts_run_past_the_planned_k_and_stay_lossless(target, smollm2, smollm2_tokenizer, reference,
                                                                   onnx_drafter):
    """With the confidence bins calibrated (here by hand: a draft the drafter gives >= 0.5 is accepted
    every time), greedy drafts go on past the cost model's k while the whole draft stays that likely:
    steps draft more than their plan asked for, output still the target's."""
    engine = make_engine(target, smollm2_tokenizer, smollm2, onnx_drafter, k=8, k_policy="auto")
    assert not engine.policy.stretch  # off by default (it did not pay here)
    engine.policy.stretch = True
    for _ in range(40):
        for p in (0.99, 0.9, 0.8, 0.7, 0.6, 0.5):
            engine.policy.cost.confidence.record([p], num_accepted=1)
    prompts = [GROUNDED, list(reference)[1]]
    ids = {engine.add_request(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True)): p
           for p in prompts}
    while engine.has_work():
        engine.step()
    stretched = planned = 0
    for seq_id, prompt in ids.items():
        seq = engine.release(seq_id)
        assert seq.output_ids == reference[prompt], prompt
        stretched += seq.stats.steps_stretched
        planned += sum(n for k, n in seq.stats.steps_per_k.items() if k)
    # steps, not tokens: early stops below the plan (the bins the run itself calibrates) may outnumber
    # the stretched tokens, by how the measured costs set the plans on the machine
    assert 0 < stretched <= planned, (stretched, planned, seq.stats.steps_per_k)
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_onnx_drafter_sampling_path_runs_and_is_seeded(target, smollm2, smollm2_tokenizer, onnx_drafter):
    engine = make_engine(target, smollm2_tokenizer, smollm2, onnx_drafter, k=3)
    ids = smollm2_tokenizer(PROMPTS[0]).input_ids
    params = SamplingParams(max_new_tokens=24, temperature=0.7, top_k=50, seed=3, ignore_eos=True)
    a, b = engine.generate(ids, params), engine.generate(ids, params)
    assert a.output_ids == b.output_ids and len(a.output_ids) == 24
    assert a.stats.num_drafted > 0


@pytest.mark.parametrize("current, num_draft, num_accepted, expected", [
    (4, 4, 4, 4),  # full accept at the cap stays at the cap
    (2, 2, 2, 4),  # full accept grows by 2
    (3, 3, 3, 4),  # ... but never past k
    (4, 4, 1, 3),  # a rejection shrinks by 1
    (1, 1, 0, 1),  # ... but never below 1
])
def test_adaptive_draft_length_rule(current, num_draft, num_accepted, expected):
    from orchestrator.engine.speculation import next_draft_len

    assert next_draft_len(current, num_draft, num_accepted, k_max=4) == expected


def test_adaptive_k_is_lossless_and_varies_the_draft_length(target, smollm2, smollm2_tokenizer, reference):
    engine = make_engine(target, smollm2_tokenizer, smollm2, NgramDrafter(), k=6, k_policy="adaptive")
    lengths = set()
    for prompt in list(reference)[-3:]:
        seq_id = engine.add_request(smollm2_tokenizer(prompt).input_ids,
                                    SamplingParams(max_new_tokens=128, ignore_eos=True))
        while engine.has_work():
            lengths.add(engine.sequences[seq_id].draft_len)
            engine.step()
        assert engine.release(seq_id).output_ids == reference[prompt], prompt
    assert len(lengths) > 2 and max(lengths) == 6


@pytest.mark.parametrize("preemption, overlap", [("recompute", False), ("swap", False), ("recompute", True)])
def test_preemption_when_the_pool_is_short_stays_lossless(smollm2, smollm2_tokenizer, reference, preemption, overlap):
    # 12 blocks of 16 tokens cannot hold three sequences of ~40 + 128 tokens at once
    small = TargetRunner(smollm2, block_size=16, max_kv_tokens=192)
    engine = Engine(small, smollm2_tokenizer, NgramDrafter(), num_speculative_tokens=4, preemption=preemption,
                    eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer), overlap=overlap)
    prompts = list(reference)[:3]
    ids = {engine.add_request(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True)): p
           for p in prompts}
    while engine.has_work():
        engine.step()
    done = {i: engine.release(i) for i in ids}
    num_preemptions = sum(s.num_preemptions for s in done.values())
    assert num_preemptions > 0
    swapped, recomputed = engine.num_preemptions_swap, engine.num_preemptions_recompute
    assert (swapped, recomputed) == ((num_preemptions, 0) if preemption == "swap" else (0, num_preemptions))
    for seq_id, prompt in ids.items():
        assert done[seq_id].output_ids == reference[prompt], prompt
    assert small.pool.num_free_blocks == small.pool.num_blocks
    assert not engine.preempter.swapped  # every host copy went back in


def test_out_of_vocab_prompt_ids_are_rejected(target, smollm2, smollm2_tokenizer):
    engine = make_engine(target, smollm2_tokenizer, smollm2)
    for bad in ([1, -1], [1, target.vocab_size]):
        with pytest.raises(InvalidRequestError, match="outside the vocabulary") as e:
            engine.add_request(bad, SamplingParams())
        assert e.value.field == "prompt"


def test_cancel_while_swapped_out_releases_the_host_copy(smollm2, smollm2_tokenizer):
    small = TargetRunner(smollm2, block_size=16, max_kv_tokens=128)
    engine = make_engine(small, smollm2_tokenizer, smollm2, NgramDrafter(), k=4, preemption="swap")
    params = SamplingParams(max_new_tokens=64, ignore_eos=True)
    ids = [engine.add_request(smollm2_tokenizer(p).input_ids, params) for p in PROMPTS[:2]]
    while not engine.preempter.swapped:
        engine.step()
    (victim,) = engine.preempter.swapped
    assert victim == ids[1] and victim not in small.pool.tables  # the newest, out of the pool
    engine.cancel(victim)
    assert not engine.preempter.swapped and engine.staging.free_bytes > 0  # its buffer is back for reuse
    while engine.has_work():
        engine.step()
    assert len(engine.release(ids[0]).output_ids) == 64
    assert small.pool.num_free_blocks == small.pool.num_blocks


KV_BYTES_PER_TOKEN = 46_080  # SmolLM2-135M in fp32: 30 layers * (K, V) * 3 heads * 64 * 4 bytes


@pytest.mark.parametrize("num_bytes, copy_bytes_per_s, num_tokens, prefill_s_per_token, expected", [
    (KV_BYTES_PER_TOKEN * 200, 1e10, 200, 1e-4, "swap"),  # fast copies: 1.8 ms out and in, 20 ms to recompute
    (KV_BYTES_PER_TOKEN * 200, 1e8, 200, 1e-4, "recompute"),  # slow copies: 184 ms against 20 ms
    (KV_BYTES_PER_TOKEN * 200, 1e9, 200, 1e-3, "swap"),  # slow prefill: 18.4 ms against 200 ms
    (KV_BYTES_PER_TOKEN * 10, 1e9, 10, 1e-5, "recompute"),  # fast prefill: 0.92 ms against 0.1 ms
    (1_000, 1e3, 1, 2.0, "recompute"),  # a tie (2 s each): the simple path
])
def test_preemption_cost_rule(num_bytes, copy_bytes_per_s, num_tokens, prefill_s_per_token, expected):
    from orchestrator.engine.preemption import choose_preemption

    assert choose_preemption(num_bytes, copy_bytes_per_s, num_tokens, prefill_s_per_token) == expected


def test_preemption_policy_follows_measurements_and_honours_forced_modes():
    from orchestrator.engine.preemption import PreemptionPolicy

    nbytes, tokens = KV_BYTES_PER_TOKEN * 100, 100
    auto = PreemptionPolicy("auto")
    assert auto.choose(nbytes, tokens) == "swap"  # priors: 1 GB/s (9.2 ms) against 0.1 ms/token (10 ms)
    auto.record_copy(nbytes, 0.5)  # measured: ~9 MB/s, the prior is gone
    assert auto.copy_bytes_per_s.get() == nbytes / 0.5 and auto.choose(nbytes, tokens) == "recompute"
    auto.record_forward(8, 8.0)  # too small a forward to price a token: ignored
    assert auto.choose(nbytes, tokens) == "recompute"
    auto.record_forward(100, 2.0)  # 20 ms/token: recomputing 100 tokens (2 s) beats 1 s of copies
    assert auto.choose(nbytes, tokens) == "swap"
    auto.record_copy(nbytes, 0.1)  # EMA: 0.8 * old + 0.2 * new
    assert auto.copy_bytes_per_s.get() == pytest.approx(0.8 * nbytes / 0.5 + 0.2 * nbytes / 0.1)
    assert PreemptionPolicy("swap").choose(nbytes, tokens) == "swap"
    assert PreemptionPolicy("recompute").choose(1, tokens) == "recompute"
    assert PreemptionPolicy("swap").choose(0, 0) == "recompute"  # nothing held, nothing to move
    with pytest.raises(ValueError, match="preemption"):
        PreemptionPolicy("swapp")


def test_overlapped_drafting_is_lossless_and_uses_its_predrafts(target, smollm2, smollm2_tokenizer, reference,
                                                                 onnx_drafter):
    """`overlap`: the next step is drafted on a worker thread while the target verifies; greedy output
    stays the target's (5 x 128 tokens here; bench/bench_overlap.py checks 10 x 128 in process and
    remote), and some steps took their drafts from the worker (hits), which the stats count."""
    engine = Engine(target, smollm2_tokenizer, onnx_drafter, num_speculative_tokens=3,
                    eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer), overlap=True)
    predrafted = 0
    for prompt, expected in list(reference.items())[-5:]:
        seq = engine.generate(smollm2_tokenizer(prompt).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True))
        assert seq.output_ids == expected, prompt
        predrafted += seq.stats.steps_predrafted
    stats = engine.overlap.stats
    assert stats.hits == predrafted > 0 and stats.misses > 0 and stats.launched >= stats.hits + stats.misses
    assert 0 < stats.hit_rate < 1 and stats.ahead_s > 0
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_overlap_in_a_batch_with_auto_k_and_a_sampled_request(target, smollm2, smollm2_tokenizer, reference,
                                                             onnx_drafter):
    """Batched: greedy sequences drafted ahead while k changes (auto), a sampled request beside them
    drafts as before (never ahead: it shares its generator with the verify); greedy output unchanged."""
    engine = Engine(target, smollm2_tokenizer, onnx_drafter, num_speculative_tokens=8, k_policy="auto",
                    eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer), overlap=True)
    prompts = list(reference)[:4]
    ids = {engine.add_request(smollm2_tokenizer(p).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True)): p
           for p in prompts}
    sampled = engine.add_request(smollm2_tokenizer(PROMPTS[5]).input_ids,
                                 SamplingParams(max_new_tokens=48, temperature=0.8, seed=3, ignore_eos=True))
    while engine.has_work():
        engine.step()
    hits = 0
    for seq_id, prompt in ids.items():
        seq = engine.release(seq_id)
        assert seq.output_ids == reference[prompt], prompt
        hits += seq.stats.steps_predrafted
    other = engine.release(sampled)
    assert len(other.output_ids) == 48 and other.stats.steps_predrafted == 0 and other.stats.num_drafted > 0
    assert hits == engine.overlap.stats.hits > 0
    assert target.pool.num_free_blocks == target.pool.num_blocks


def test_overlap_with_the_ngram_drafter_is_lossless(target, smollm2, smollm2_tokenizer, reference):
    engine = Engine(target, smollm2_tokenizer, NgramDrafter(), num_speculative_tokens=4,
                    eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer), overlap=True)
    seq = engine.generate(smollm2_tokenizer(GROUNDED).input_ids, SamplingParams(max_new_tokens=128, ignore_eos=True))
    assert seq.output_ids == reference[GROUNDED]
    # the lookup drafted ahead from tokens not yet verified (at least while the gate measured both ways)
    assert engine.overlap.stats.launched > 0 and engine.overlap.stats.hits + engine.overlap.stats.misses > 0
