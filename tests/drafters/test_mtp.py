"""The MTP drafter's mechanics on a tiny random target: hidden states arrive as blocks and are checked,
incremental drafting equals the training-time forward, and greedy output equals target-only."""

import pytest
import torch

import protocol
from orchestrator.config import SamplingParams
from orchestrator.drafters.mtp import MtpDrafter
from orchestrator.engine import Engine
from orchestrator.engine.hidden_feed import HiddenFeed
from orchestrator.errors import CheckpointError, HetspecError
from orchestrator.models import TargetRunner, Transformer
from orchestrator.mtp import MtpConfig, MtpModel

from conftest import tiny_checkpoint


def _mtp(tmp_path, ckpt, draft_vocab=60, seed=1):
    target = Transformer.load(ckpt.hf_dir, torch.device("cpu"), torch.float32, onednn=False)
    config = MtpConfig.for_target(target.spec, ckpt.key, "tiny", draft_vocab)
    torch.manual_seed(seed)
    model = MtpModel(config, target.embed.clone(), torch.arange(draft_vocab) * 97 // draft_vocab)
    model.set_head(target.lm_head)
    with torch.no_grad():  # a sharper random drafter: some drafts agree, most do not
        model.fc.weight.mul_(4)
    out = tmp_path / "mtp"
    model.save(out)
    return out


@pytest.fixture
def tiny(tmp_path):
    ckpt, _ = tiny_checkpoint(tmp_path / "target")
    return ckpt, _mtp(tmp_path, ckpt)


def _feed(drafter, target, seq_id, ids, start=0):
    """Run the tiny target over ids[start:] and hand the drafter the states of all but the newest."""
    (out,) = target.forward([(seq_id, ids[start:], 1)], return_hidden=True)
    feed = HiddenFeed(drafter, target.model_id)
    feed.capture([seq_id], [start], [out])
    feed.deliver(seq_id, len(ids) - 1)
    target.rollback(seq_id, len(ids) - 1)
    return out.hidden


def test_drafting_incrementally_equals_the_training_forward(tiny):
    ckpt, path = tiny
    target, drafter = TargetRunner(ckpt, max_kv_tokens=256), MtpDrafter(path)
    ids = [3, 17, 42, 8, 66, 5, 21]
    drafter.start(0, ids[:4])
    _feed(drafter, target, 0, ids[:4])
    first = drafter.propose(0, 3).draft_ids
    drafter.extend(0, ids[4:])  # three more committed, then their states
    hidden = _feed(drafter, target, 0, ids, start=3)
    drafts = drafter.propose(0, 4)
    model = MtpModel.load(path)
    full_hidden = TargetRunner(ckpt, max_kv_tokens=256).forward([(1, ids, len(ids))], return_hidden=True)[0].hidden
    torch.testing.assert_close(hidden, full_hidden[3:])
    with torch.no_grad():
        feats = model(full_hidden[None, :-1], torch.tensor([ids[1:]]))[0]
        expected = int(model.draft_ids[model.logits(feats[-1]).argmax()])
        expected_first = int(model.draft_ids[model.logits(feats[2]).argmax()])
    assert drafts.draft_ids[0] == expected and first[0] == expected_first
    assert len(drafts.draft_ids) == 4 and len(drafts.confidence) == 4
    assert all(t in set(model.draft_ids.tolist()) for t in drafts.draft_ids)


@pytest.mark.parametrize("transport", ["inline", "shared_memory"])
def test_greedy_output_equals_target_only_and_drafts_are_judged(tiny, smollm2_tokenizer, transport):
    ckpt, path = tiny
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompts = [[5, 9, 12, 40, 7], [1, 2, 3], [60, 61, 62, 63, 64, 65, 66, 67]]
    plain = Engine(TargetRunner(ckpt, max_kv_tokens=1024), smollm2_tokenizer)
    expected = [plain.generate(p, params).output_ids for p in prompts]
    drafter = MtpDrafter(path)
    engine = Engine(TargetRunner(ckpt, max_kv_tokens=1024), smollm2_tokenizer, drafter, num_speculative_tokens=3,
                    block_transport=transport)
    ids = [engine.add_request(p, params) for p in prompts]  # batched: three sequences per step
    while engine.has_work():
        engine.step()
    seqs = [engine.release(i) for i in ids]
    assert [s.output_ids for s in seqs] == expected
    assert all(s.stats.num_drafted > 0 for s in seqs)
    assert engine.hidden_feed.bytes_sent > 0 and not drafter._seqs  # every sequence finished in the drafter
    sampled = engine.generate(prompts[0], SamplingParams(max_new_tokens=12, temperature=0.9, seed=3))
    assert len(sampled.output_ids) == 12


def test_blocks_from_another_model_size_or_range_are_refused(tiny, tmp_path):
    ckpt, path = tiny
    drafter = MtpDrafter(path)
    drafter.start(0, [1, 2, 3, 4])
    packer = protocol.BlockPacker("inline")

    def block(rows, model_id=ckpt.key, tokens=(0, 3)):
        return packer.pack(protocol.encode(rows, kind=protocol.TensorKind.HIDDEN_STATE,
                                           layout=protocol.Layout.TOKENS_HIDDEN, model_id=model_id,
                                           sequence_id=0, tokens=tokens))

    with pytest.raises(protocol.BlockError, match="model_id"):
        drafter.accept_hidden(0, block(torch.zeros(3, 32), model_id="other"))
    with pytest.raises(protocol.BlockError, match="hidden size 16"):
        drafter.accept_hidden(0, block(torch.zeros(3, 16)))
    with pytest.raises(protocol.BlockError, match="tokens"):  # runs past the committed tokens
        drafter.accept_hidden(0, block(torch.zeros(5, 32), tokens=(0, 5)))
    with pytest.raises(protocol.BlockError, match="tokens"):  # leaves a gap
        drafter.accept_hidden(0, block(torch.zeros(1, 32), tokens=(2, 3)))
    with pytest.raises(protocol.BlockError, match="kind"):
        drafter.accept_hidden(0, packer.pack(protocol.encode(torch.zeros(3, 32), kind=protocol.TensorKind.DRAFT_PROBS,
                                                             layout=protocol.Layout.TOKENS_VOCAB)))
    assert drafter.propose(0, 3).draft_ids == []  # no states yet: nothing to draft from
    drafter.accept_hidden(0, block(torch.zeros(3, 32)))
    assert len(drafter.propose(0, 3).draft_ids) == 3
    with pytest.raises(CheckpointError, match="not an MTP drafter"):
        MtpDrafter(tmp_path)


def test_hidden_states_reach_a_remote_mtp_drafter_and_are_sent_again_after_a_restart(tiny, smollm2_tokenizer):
    """Over a real loopback gRPC drafter server: lossless, drafting from states sent over the wire; the
    server is stopped mid-run and a new one started on its port: the re-opened sequences get all their
    states again and drafting resumes."""
    from orchestrator.server import ServerOptions, start_server
    from orchestrator.server.drafter_service import DrafterServicer
    from orchestrator.server.remote_drafter import RemoteDrafter

    ckpt, path = tiny
    params = SamplingParams(max_new_tokens=120, ignore_eos=True)
    prompts = [[5, 9, 12, 40, 7], [60, 61, 62, 63, 64, 65, 66, 67]]
    plain = Engine(TargetRunner(ckpt, max_kv_tokens=1024), smollm2_tokenizer)
    expected = [plain.generate(p, params).output_ids for p in prompts]
    served = start_server(ServerOptions(port=0), [DrafterServicer(MtpDrafter(path), vocab_size=97).register])
    port = served.port
    drafter = RemoteDrafter(f"127.0.0.1:{port}", vocab_size=97, reads_hidden=True, model_id=ckpt.key,
                            backoff_s=(0.05, 0.1))
    try:
        engine = Engine(TargetRunner(ckpt, max_kv_tokens=1024), smollm2_tokenizer, drafter, num_speculative_tokens=3)
        ids = [engine.add_request(p, params) for p in prompts]
        for _ in range(8):
            engine.step()
        drafted_before = sum(engine.sequences[i].stats.num_drafted for i in ids)
        served.stop(0)
        engine.step()  # the dead session fails over: target-only
        served = start_server(ServerOptions(port=port), [DrafterServicer(MtpDrafter(path), vocab_size=97).register])
        while engine.has_work():
            engine.step()
        seqs = [engine.release(i) for i in ids]
        assert [s.output_ids for s in seqs] == expected
        assert drafted_before > 0 and drafter.num_reconnects == 1
        assert sum(s.stats.num_drafted for s in seqs) > drafted_before  # speculation resumed with re-sent states
        assert all(s.stats.num_fallback_steps > 0 for s in seqs)
    finally:
        drafter.close()
        served.stop(0)


def _drafts_on(device, ckpt, path, **kw):
    target, drafter = TargetRunner(ckpt, max_kv_tokens=256), MtpDrafter(path, device=device, **kw)
    ids = [3, 17, 42, 8, 66, 5, 21, 9, 14]
    drafter.start(0, ids)
    _feed(drafter, target, 0, ids)
    return drafter.propose(0, 5).draft_ids


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_drafter_on_cuda_drafts_as_on_the_cpu(tiny):
    assert _drafts_on("cuda:0", *tiny) == _drafts_on("cpu", *tiny)


@pytest.mark.npu
@pytest.mark.skipif(not hasattr(torch, "npu"), reason="needs an Ascend NPU with torch-npu and CANN")
def test_the_drafter_on_npu_drafts_as_on_the_cpu(tiny):
    assert _drafts_on("npu:0", *tiny) == _drafts_on("cpu", *tiny)


def test_the_onnx_export_drafts_as_the_torch_layer_and_quantizes(tiny, smollm2_tokenizer):
    ckpt, path = tiny
    assert _drafts_on("cpu", ckpt, path, runtime="onnx", precision="fp32") == _drafts_on("cpu", ckpt, path)
    int4 = _drafts_on("cpu", ckpt, path, runtime="onnx", precision="int4")
    assert len(int4) == 5 and set(int4) <= set(MtpModel.load(path).draft_ids.tolist())
    sizes = {p: sum(f.stat().st_size for f in (path / f"onnx-{p}").iterdir()) for p in ("fp32", "int4")}
    assert sizes["int4"] < sizes["fp32"]
    import onnx

    ops = {n.op_type for n in onnx.load(str(path / "onnx-int4" / "model.onnx"), load_external_data=False).graph.node}
    assert "MatMulNBits" in ops
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    prompt = [5, 9, 12, 40, 7]
    expected = Engine(TargetRunner(ckpt, max_kv_tokens=512), smollm2_tokenizer).generate(prompt, params).output_ids
    engine = Engine(TargetRunner(ckpt, max_kv_tokens=512), smollm2_tokenizer,
                    MtpDrafter(path, runtime="onnx", precision="int4"), num_speculative_tokens=3)
    seq = engine.generate(prompt, params)
    assert seq.output_ids == expected and seq.stats.num_drafted > 0


def test_combined_with_an_ngram_lookup_the_mtp_drafter_still_gets_its_states(tiny, smollm2_tokenizer):
    from orchestrator.drafters.combined import CombinedDrafter
    from orchestrator.drafters.ngram import NgramDrafter

    ckpt, path = tiny
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompt = [5, 9, 12, 40, 7, 5, 9, 12]
    expected = Engine(TargetRunner(ckpt, max_kv_tokens=512), smollm2_tokenizer).generate(prompt, params).output_ids
    mtp = MtpDrafter(path)
    combined = CombinedDrafter([NgramDrafter(), mtp])
    assert combined.reads_hidden
    engine = Engine(TargetRunner(ckpt, max_kv_tokens=512), smollm2_tokenizer, combined, num_speculative_tokens=3)
    seq_id = engine.add_request(prompt, params)
    engine.step()
    engine.step()
    assert mtp._seqs[seq_id].num_hidden == len(mtp._seqs[seq_id].tokens) - 1  # states of all but the newest
    while engine.has_work():
        engine.step()
    assert engine.release(seq_id).output_ids == expected


def test_runtime_auto_times_both_runtimes_and_keeps_the_faster(tiny, monkeypatch):
    """`runtime: auto` times a one-token call of the torch layer and of its fp32 export at start-up and
    drafts with the faster, as that runtime would; where neither runtime can run it says so."""
    from orchestrator.drafters import mtp

    ckpt, path = tiny
    drafter = MtpDrafter(path, runtime="auto")
    assert set(drafter.timings_ms) == {"torch", "onnx"} and all(t > 0 for t in drafter.timings_ms.values())
    fastest = min(drafter.timings_ms, key=drafter.timings_ms.get)
    assert drafter.runtime == fastest and drafter.name == {"torch": "mtp", "onnx": "mtp-onnx-fp32"}[fastest]
    assert _drafts_on("cpu", ckpt, path, runtime="auto") == _drafts_on("cpu", ckpt, path)
    for slower in ("torch", "onnx"):  # the choice follows the timings whichever way they fall
        monkeypatch.setattr(mtp, "time_call", lambda r, slower=slower: 2.0 if isinstance(
            r, mtp._TorchRunner if slower == "torch" else mtp._OrtRunner) else 1.0)
        chosen = MtpDrafter(path, runtime="auto")
        assert chosen.runtime != slower and chosen.timings_ms[slower] == 2000.0
    with pytest.raises(HetspecError, match="mtp runtime auto: neither runtime can run on cuda:63"):
        MtpDrafter(path, device="cuda:63", runtime="auto")
