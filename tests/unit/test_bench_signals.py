"""``exit_on_signals``: a benchmark killed by a signal exits 128 + its number, even when the signal arrives inside
a C extension's call that puts its own exception in place of the handler's ``SystemExit``."""

from __future__ import annotations

import os
import signal

import pytest

from deploy.bench_stack import exit_on_signals


def _signalled_inside_an_extension(sig: signal.Signals) -> None:
    """What confluent-kafka's ``produce`` did: the handler ran inside the call, which raised its own error."""
    try:
        os.kill(os.getpid(), sig)
    except SystemExit as exc:
        raise TypeError("expected header key to be unicode string") from exc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_whose_exit_an_extension_replaced_still_exits_with_its_code(sig: signal.Signals) -> None:
    before = signal.getsignal(sig)
    with pytest.raises(SystemExit) as stopped, exit_on_signals():
        _signalled_inside_an_extension(sig)
    assert stopped.value.code == 128 + sig
    assert isinstance(stopped.value.__cause__, TypeError)
    assert signal.getsignal(sig) is before


def test_an_error_without_a_signal_is_left_as_it_is() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TypeError, match="a bug"), exit_on_signals():
        raise TypeError("a bug")
    assert signal.getsignal(signal.SIGTERM) is before
