"""The MTP drafter's training data: the built-in prompt set (varied, deterministic, disjoint from what
the benches measure) and the self-distilled responses whose hidden states are kept as the target
computes them (they must equal a separate teacher pass, or training would learn other states)."""

import difflib

import torch

from orchestrator.config import SamplingParams
from orchestrator.engine import Engine
from orchestrator.latency.workloads import BUILTIN
from orchestrator.models import TargetRunner, encode_prompt, eos_token_ids
from orchestrator.mtp import MtpConfig, MtpModel
from orchestrator.mtp.data import TeacherData, self_distill, teacher_pass
from orchestrator.mtp.prompts import training_prompts
from orchestrator.mtp.train import evaluate

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
    reference = teacher_pass(smollm2, [ids for ids, _, _, _ in items], progress=False)
    for (ids, hidden, argmax, start), (_, ref_hidden, ref_argmax) in zip(items, reference):
        prompt = next(k for k in expected if ids[:len(k)] == list(k))
        full = expected[prompt]
        assert ids == full[:-1]  # the response's last token has no state: left out
        assert start == len(prompt)  # where the response begins: the held-out report starts there
        assert hidden.dtype == torch.float16 and hidden.shape == (len(ids), 576)
        torch.testing.assert_close(hidden.float(), ref_hidden.float(), atol=2e-2, rtol=1e-2)
        assert torch.equal(argmax, ref_argmax)
        assert argmax[-1] == full[-1]  # the token after the last kept position is the one left out


def test_self_distillation_stops_at_its_token_budget_and_keeps_what_ran(smollm2, smollm2_tokenizer):
    items = self_distill(smollm2, smollm2_tokenizer, training_prompts()[:6], max_new_tokens=50, num_tokens=30,
                         progress=False, batch_size=3)
    # 3 running, one token each a step: the budget of 30 is spent after 10 steps, nothing finished
    prompt_lengths = [len(encode_prompt(smollm2_tokenizer, p, chat=True)) for p in training_prompts()[:3]]
    assert sorted(len(ids) for ids, _, _, _ in items) == sorted(n + 9 for n in prompt_lengths)
    assert sorted(start for *_, start in items) == sorted(prompt_lengths)


def tiny_mtp(H: int, V: int) -> MtpModel:
    """A randomly initialised MTP layer (mechanics, not a model): hidden size H, vocabulary V."""
    config = MtpConfig(target_model_id="t", target_name="t", hidden_size=H, num_heads=4, num_kv_heads=2,
                       head_dim=8, intermediate_size=64, vocab_size=V, draft_vocab_size=V)
    model = MtpModel(config, torch.randn(V, H), torch.arange(V))
    model.set_head(torch.randn(V, H))
    return model


def test_the_held_out_report_counts_only_what_is_drafted_at_inference():
    """A drafter that knows the prompt by heart and nothing of the response scores nothing: drafting
    starts after the prompt's last state and the first response token, top-1 counts the response."""
    torch.manual_seed(0)
    H, V, n, start = 32, 50, 24, 12
    model = tiny_mtp(H, V)
    tokens, hidden = torch.randint(0, V, (n,)), torch.randn(n, H)
    with torch.inference_mode():
        pred = model.logits(model.forward(hidden[None, :-1], tokens[None, 1:])[0]).argmax(-1)
    argmax = torch.zeros(n, dtype=torch.long)
    argmax[1:start] = pred[:start - 1]  # the drafter's first draft is right at every prompt position...
    argmax[start:] = (pred[start - 1:] + 1) % V  # ...and wrong on every token of the response

    def report(first):
        data = TeacherData(tokens, hidden.half(), argmax, torch.tensor([0, n]), torch.tensor([True]),
                           torch.tensor([first]))
        with torch.inference_mode():
            return evaluate(model, data, [0], positions=3)

    whole, response = report(0), report(start)
    assert whole["top1"] == (start - 1) / (n - 1) and whole["alpha"][0] == (start - 1) / (n - 2)  # looks good
    assert response["top1"] == 0.0 and response["alpha"][0] == 0.0  # what inference would see
    assert response["tried"][0] == n - 2 - (start - 1)  # one start per response position with a token after


def test_the_loss_over_slices_of_logits_equals_the_loss_over_the_whole_batch(monkeypatch):
    """Training computes the token losses over slices of positions (no 64 MiB logits tensor per pass) and
    the target's log-probabilities once for all unrolled passes: same loss and gradients as the formula
    over the whole batch at once."""
    from orchestrator.mtp import train

    torch.manual_seed(0)
    H, V, B, T = 32, 50, 3, 11
    model = tiny_mtp(H, V)
    hidden, next_h = torch.randn(B, T, H), torch.randn(B, T, H)
    next_ids, labels = torch.randint(0, V, (B, T)), torch.randint(0, V, (B, T))
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 7:] = False  # a short window, padded
    labels[~mask] = -100
    labels[0, :4] = -100  # outside the draft vocabulary
    opts = train.TrainOptions(target="t", out=None, noise=0.0, unroll=2)
    progress = 0.3

    def whole_batch():  # the formula over every position at once, as before slicing
        tau, w = 2.0 + (1.0 - 2.0) * progress, 0.9 + (0.2 - 0.9) * progress
        h_in, total = hidden, 0.0
        for u, weight in enumerate([1.0, 0.5]):
            feats = model(h_in, next_ids)
            f, h, y = feats[mask], next_h[mask], labels[mask]
            scale = h.pow(2).mean().sqrt()
            student, teacher = model.logits(f), model.logits(h)
            soft = torch.nn.functional.kl_div((student / tau).log_softmax(-1), (teacher / tau).log_softmax(-1),
                                              log_target=True, reduction="batchmean") * tau * tau
            hard = torch.nn.functional.cross_entropy(student, y, ignore_index=-100)
            loss = torch.nn.functional.smooth_l1_loss(f / scale, h / scale) + w * soft + (1 - w) * hard
            total = total + loss * weight / 1.5
            h_in = torch.cat([h_in[:, :1], feats[:, :-1].detach()], dim=1)
        return total

    def grads(loss):
        model.zero_grad()
        loss.backward()
        return [p.grad.clone() for p in model.parameters() if p.requires_grad]

    expected = whole_batch()
    expected_grads = grads(expected)
    monkeypatch.setattr(train, "LOGIT_ROWS", 4)  # 30 positions: 8 slices, the last one short
    got, metrics = train._loss(model, (hidden, next_ids, next_h, labels, mask), opts, progress,
                               torch.Generator())
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads(got), expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    with torch.no_grad():
        first = model.logits(model(hidden, next_ids)[mask]).argmax(-1)
    y = labels[mask]
    assert metrics["top1_pass1"] == ((first == y) & (y >= 0)).sum().item() / (y >= 0).sum().item()
