"""onceq._core.early: the consume commands take a stop signal from onceq's first line.

The process tests (tests/faults/test_early_stop.py) send the signal from the moment
the process catches SIGTERM; these show that moment is onceq's first line (before
click, the flow file or asyncio), and that nothing else is changed: another command,
or a program that imports onceq, keeps the signals' default action.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from onceq._core.early import command_consumes

PROBE = (
    "import sys; sys.argv = {argv!r}\n"
    "import signal, onceq\n"
    "print(signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL, 'click' in sys.modules)\n"
)


def _probe(argv: list[str]) -> str:
    code = PROBE.format(argv=argv)
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return done.stdout.strip()


@pytest.mark.parametrize(
    ("args", "consumes"),
    [
        (["run", "flows.toml"], True),
        (["run", "--until-empty", "flows.toml"], True),
        (["mq", "consume", "--claim", "http://x"], True),
        (["dirq", "consume", "q"], True),
        (["nats", "consume", "--stream", "S"], True),  # any source's consume, by the rule
        (["dirq", "lag", "q"], False),
        (["mq", "topology"], False),
        (["status", "--watch"], False),
        (["check", "run"], False),
        ([], False),
    ],
)
def test_the_consume_commands_are_the_ones_caught(args: list[str], consumes: bool) -> None:
    assert command_consumes(args) is consumes


def test_the_onceq_command_catches_sigterm_before_it_imports_click() -> None:
    assert _probe(["/venv/bin/onceq", "run", "flows.toml"]) == "True False"
    assert _probe(["/venv/bin/onceq", "mq", "consume"]) == "True False"


def test_other_commands_and_programs_keep_the_default_action() -> None:
    assert _probe(["/venv/bin/onceq", "dirq", "lag", "q"]) == "False False"
    assert _probe(["/usr/bin/myapp", "run", "flows.toml"]) == "False False"


def test_a_signal_before_the_loop_stops_the_run_once_it_starts() -> None:
    """The Stop that starts later replays a kept signal: a clean stop, not a second one."""
    code = (
        "import asyncio, os, signal\n"
        "from onceq._core import early\n"
        "from onceq._core.stop import Stop\n"
        "early.catch()\n"
        "os.kill(os.getpid(), signal.SIGTERM)\n"
        "async def main():\n"
        "    stop = Stop(second='raise')\n"
        "    with stop.installed():\n"
        "        pass\n"
        "    print(stop.requested, stop.signals)\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "True [15]"


# The hand-over: a signal that comes while the loop installs its handlers.
HAND_OVER = """\
import asyncio, os, signal
from onceq._core import early
from onceq._core.stop import Stop
early.catch()

async def main():
    loop = asyncio.get_running_loop()
    real = loop.add_signal_handler
    def add(sig, *args):
        real(sig, *args)
        if sig == signal.SIGINT:  # the wakeup fd is set; early's SIGTERM handler still in place
            os.kill(os.getpid(), signal.SIGTERM)
    loop.add_signal_handler = add
    stop = Stop(second="raise")
    with stop.installed():
        for _ in range(10):
            await asyncio.sleep(0.01)
        print("stopped by", stop.signals, flush=True)
        if {again}:
            os.kill(os.getpid(), signal.SIGTERM)  # a real second signal
            await asyncio.sleep(1)
    print("ended", flush=True)

asyncio.run(main())
"""


def _hand_over(again: bool) -> subprocess.CompletedProcess[str]:
    code = HAND_OVER.format(again=again)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_signal_during_the_hand_over_to_the_loop_counts_once() -> None:
    """Kept by early AND written to the loop's wakeup pipe: counted twice it was a
    second signal, and the process died of SIGTERM's default action (a rare CI failure
    of tests/faults/test_early_stop.py: exit -15, nothing printed)."""
    done = _hand_over(again=False)
    assert (done.returncode, done.stdout) == (0, "stopped by [15]\nended\n"), done.stderr


def test_a_second_signal_after_the_hand_over_still_ends_the_process_at_once() -> None:
    done = _hand_over(again=True)
    assert done.returncode == -15, (done.stdout, done.stderr)
    assert done.stdout == "stopped by [15]\n"
