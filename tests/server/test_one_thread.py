"""`OneThread`: calls from handler threads run in order on the thread in `run()` (how `hetspec drafter
serve` keeps its drafter on the main thread), calls made before `run()` wait for it, errors reach the
caller, and calls after `stop()` run on the caller's thread, never lost."""

import threading

import pytest

from orchestrator.server.one_thread import OneThread


def test_calls_from_other_threads_run_on_the_runner_and_errors_reach_the_caller():
    runner = OneThread()
    ran_on, results, errors = [], [], []

    def handler(i: int):
        results.append(runner.call(lambda: (ran_on.append(threading.get_ident()), i * i)[1]))
        try:
            runner.call(lambda: 1 / 0)
        except ZeroDivisionError as e:
            errors.append(e)

    def clients():
        threads = [threading.Thread(target=handler, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        runner.stop()

    driver = threading.Thread(target=clients)
    driver.start()
    threading.Event().wait(0.05)  # calls made before run() starts wait for it
    runner.run()  # until the clients are done
    driver.join(10)
    assert sorted(results) == [i * i for i in range(8)] and len(errors) == 8
    assert set(ran_on) == {threading.get_ident()}
    other = []
    t = threading.Thread(target=lambda: other.append(runner.call(threading.get_ident)))
    t.start()
    t.join(10)
    assert other and other[0] != threading.get_ident()  # stopped: the caller's thread again


def test_calls_are_never_run_two_at_once():
    runner, inside, overlaps = OneThread(), [0], []
    runner.stop()
    runner.run()  # stopped at once: every call runs on its caller's thread, one at a time

    def work():
        inside[0] += 1
        overlaps.append(inside[0])
        threading.Event().wait(0.002)
        inside[0] -= 1

    threads = [threading.Thread(target=lambda: [runner.call(work) for _ in range(5)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert max(overlaps) == 1 and len(overlaps) == 20


def test_a_failing_call_does_not_stop_the_runner():
    runner = OneThread()
    done = []

    def clients():
        with pytest.raises(ValueError):
            runner.call(lambda: (_ for _ in ()).throw(ValueError("bad frame")))
        done.append(runner.call(lambda: "still serving"))
        runner.stop()

    t = threading.Thread(target=clients)
    t.start()
    runner.run()
    t.join(10)
    assert done == ["still serving"]


def test_without_hand_over_every_call_runs_on_its_caller():
    runner, ran_on = OneThread(hand_over=False), []
    threads = [threading.Thread(target=lambda: ran_on.append((runner.call(threading.get_ident), threading.get_ident())))
               for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(ran_on) == 3 and all(a == b for a, b in ran_on)
