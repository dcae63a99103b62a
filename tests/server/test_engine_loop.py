"""The engine loop stepped on the caller's thread (`own_thread=False`), as `hetspec serve` runs it:
requests from other threads are served, and `stop()` from another thread ends `run()`."""

import signal
import threading

import pytest

from orchestrator.config import SamplingParams
from orchestrator.engine import Engine
from orchestrator.models import TargetRunner, encode_prompt, eos_token_ids
from orchestrator.server.client import GenerationClient
from orchestrator.server.engine_loop import Done, EngineLoop

from prompts import PROMPTS
from servers import Server, write_profile


def test_the_loop_steps_on_the_callers_thread_and_serves_other_threads(smollm2, smollm2_tokenizer):
    target = TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)
    engine = Engine(target, smollm2_tokenizer, None, eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer))
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    prompts = [encode_prompt(smollm2_tokenizer, p, chat=True) for p in PROMPTS[:3]]
    want = [engine.generate(ids, params).output_ids for ids in prompts]
    loop = EngineLoop(engine, "none", max_active=4, own_thread=False)
    stepped_on, got, errors = set(), {}, []
    step = engine.step

    def counted_step():
        stepped_on.add(threading.get_ident())
        return step()

    engine.step = counted_step

    def clients():
        try:
            for i, ids in enumerate(prompts):
                _, events = loop.submit(ids, params)
                while not isinstance(event := events.get(timeout=60), Done):
                    pass
                assert event.error is None, event.error
                got[i] = event.result["token_ids"]
        except Exception as e:  # noqa: BLE001 - surfaced below, on the test's thread
            errors.append(e)
        finally:
            loop.stop()

    t = threading.Thread(target=clients)
    t.start()
    loop.run()  # returns once the client thread has stopped the loop
    t.join(10)
    assert not errors, errors
    assert stepped_on == {threading.get_ident()}  # every step ran here, none on a thread of the loop's
    assert [got[i] for i in range(len(prompts))] == want


def test_sigterm_mid_stream_lets_the_stream_finish_then_the_server_exits_cleanly(tmp_path, smollm2_tokenizer):
    """`hetspec serve` steps its engine on the main thread; a SIGTERM there starts the shutdown on
    another thread, and the engine keeps stepping through the grace period."""
    profile = write_profile(tmp_path / "p.yaml", None)
    server = Server("serve", "--profile", str(profile), "--port", "0")
    try:
        with GenerationClient(server.address) as c:
            stream = c.stream(PROMPTS[0], max_new_tokens=40, ignore_eos=True, timeout=60)
            first = next(stream)  # the request is running
            assert first.token_ids
            server.proc.send_signal(signal.SIGTERM)
            rest = list(stream)
        assert rest[-1].final is not None and rest[-1].final.usage.completion_tokens == 40
        assert server.proc.wait(30) == 0
        assert "shutting down" in server.log()
    finally:
        server.kill()


def test_an_engine_built_on_the_loops_thread_is_stepped_there(smollm2, smollm2_tokenizer):
    """`built_on_own_thread` (a Ray target replica's loop): the engine is made and stepped on one
    thread, not the caller's; a failing `make` raises in the caller."""
    made_on = []

    def make():
        made_on.append(threading.get_ident())
        target = TargetRunner(smollm2, block_size=16, max_kv_tokens=4096)
        return Engine(target, smollm2_tokenizer, None, eos_token_ids=eos_token_ids(smollm2, smollm2_tokenizer))

    loop = EngineLoop.built_on_own_thread(make, "none", max_active=2)
    try:
        stepped_on = set()
        step = loop.engine.step

        def counted_step():
            stepped_on.add(threading.get_ident())
            return step()

        loop.engine.step = counted_step
        ids = encode_prompt(smollm2_tokenizer, PROMPTS[0], chat=True)
        _, events = loop.submit(ids, SamplingParams(max_new_tokens=4, ignore_eos=True))
        while not isinstance(event := events.get(timeout=60), Done):
            pass
        assert event.error is None and len(event.result["token_ids"]) == 4
        assert stepped_on == set(made_on) and threading.get_ident() not in made_on
    finally:
        loop.stop()

    def broken():
        raise ValueError("no such model")

    with pytest.raises(ValueError, match="no such model"):
        EngineLoop.built_on_own_thread(broken, "none", max_active=2)
