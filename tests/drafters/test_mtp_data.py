"""The MTP drafter's training data: the built-in prompt set (varied, deterministic, disjoint from what
the benches measure) and the self-distilled responses whose hidden states are kept as the target
computes them (they must equal a separate teacher pass, or training would learn other states)."""

import difflib

import torch

from orchestrator.config import SamplingParams
from orchestrator.engine import Engine
from orchestrator.latency.workloads import BUILTIN
from orchestrator.models import TargetRunner, encode_prompt, eos_token_ids
from orchestrator.mtp.data import self_distill, teacher_pass
from orchestrator.mtp.prompts import training_prompts

from prompts import CODE, GROUNDED, PROMPTS


def test_the_prompt_set_is_varied_deterministic_and_disjoint_from_the_measured_prompts():
    prompts = training_prompts()
    assert prompts == training_prompts() and len(set(prompts)) == len(prompts) >= 800
    first = {p.split()[0] for p in prompts[:40]}  # the kinds are dealt in turn: the start mixes them
    assert {"Explain", "Write", "Translate", "Tell", "List", "Q:", "def"} <= first, first
    measured = PROMPTS + CODE + [GROUNDED] + [p for ps in BUILTIN.values() for p in ps]
    for m in measured:
        close = difflib.get_close_matches(m, prompts, n=1, cutoff=0.9)
        assert not close, (m, close)


def test_self_distilled_states_equal_a_teacher_pass_and_responses_equal_greedy_decoding(smollm2,
                                                                                         smollm2_tokenizer):
    tok, prompts = smollm2_tokenizer, training_prompts()[:5]
    # batch of 2: later prompts are prefilled in the same forward as the others' next tokens
    items = self_distill(smollm2, tok, prompts, max_new_tokens=12, num_tokens=10**6, progress=False, batch_size=2)
    assert len(items) == 5
    engine = Engine(TargetRunner(smollm2, max_kv_tokens=2048), tok, eos_token_ids=eos_token_ids(smollm2, tok))
    expected = {}
    for p in prompts:
        ids = encode_prompt(tok, p, chat=True)
        out = engine.generate(ids, SamplingParams(max_new_tokens=12))
        expected[tuple(ids)] = ids + out.output_ids
    reference = teacher_pass(smollm2, [ids for ids, _, _ in items], progress=False)
    for (ids, hidden, argmax), (_, ref_hidden, ref_argmax) in zip(items, reference):
        full = next(v for k, v in expected.items() if ids[:len(k)] == list(k))
        assert ids == full[:-1]  # the response's last token has no state: left out
        assert hidden.dtype == torch.float16 and hidden.shape == (len(ids), 576)
        torch.testing.assert_close(hidden.float(), ref_hidden.float(), atol=2e-2, rtol=1e-2)
        assert torch.equal(argmax, ref_argmax)
        assert argmax[-1] == full[-1]  # the token after the last kept position is the one left out


def test_self_distillation_stops_at_its_token_budget_and_keeps_what_ran(smollm2, smollm2_tokenizer):
    items = self_distill(smollm2, smollm2_tokenizer, training_prompts()[:6], max_new_tokens=50, num_tokens=30,
                         progress=False, batch_size=3)
    # 3 running, one token each a step: the budget of 30 is spent after 10 steps, nothing finished
    prompt_lengths = [len(encode_prompt(smollm2_tokenizer, p, chat=True)) for p in training_prompts()[:3]]
    assert sorted(len(ids) for ids, _, _ in items) == sorted(n + 9 for n in prompt_lengths)
